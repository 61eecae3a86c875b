"""A DVC stage's entry (`runner.run`): the stage lock, the params gate (so it sits above medrank.params), the last good
outputs moved aside and put back on failure (medrank.core.stash), one-line errors. Every stages/*.py module, the CLI
and the seal tool start through it."""
