"""What every other package stands on: `errors` (MedrankError, the one user-facing error), `io` (atomic writes,
parquet and JSON readers, sealed side files), `layout` (every path of the repository), `stash` (a running stage's
last good outputs; the stage entry itself, medrank.stage.runner, sits above medrank.params), `frame` (Frame, `>>` composition, Pipeline: what the inference steps take
and return), `live` (the dvclive opener), `forking` (worker pools that die with their parent). The migration tool that
seals model side files reads every model kind, so it sits at the top: `python -m medrank.serving.seal`."""
