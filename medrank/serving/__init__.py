"""The trained pipeline on new questions: `steps` (the saved step objects and InferencePipeline, what the stages save
and `medrank rank` loads), `rank` (`medrank rank`: input checks and caps, Ranker), `app` (`medrank serve`: FastAPI +
uvicorn, the `serve` extra; docs/serving.md: create_app, ServeConfig), `protocol` (what it reads and answers over
HTTP: body parsing and caps, the one-line errors, the JSON schemas), `batching` (Scheduler: the bounded queue in
front of the compute threads, 503 when full), `ray_app` (the same app on Ray Serve). Nothing is imported here, so
`medrank rank` and the stages need no web framework."""
