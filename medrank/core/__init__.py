"""What every other package stands on: `errors` (MedrankError, the one user-facing error), `io` (atomic writes,
parquet and JSON readers, sealed side files), `layout` (every path of the repository), `runner` (a stage's entry:
lock, one-line errors, leftovers swept), `frame` (Frame, `>>` composition, Pipeline: what the inference steps take
and return), `live` (the dvclive opener), `forking` (worker pools that die with their parent), `seal` (the migration
tool that seals model side files: `python -m medrank.core.seal`)."""
