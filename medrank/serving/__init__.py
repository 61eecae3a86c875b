"""The trained pipeline on new questions: `steps` (the saved step objects and InferencePipeline, what the stages save
and `medrank rank` loads), `rank` (`medrank rank`: input checks and caps, Ranker), and `medrank serve` (FastAPI +
uvicorn, the `serve` extra; docs/serving.md):

create_app(config, ranker)  the ASGI app: POST /rank, /rank/batch; GET /healthz, /readyz, /version, / (a form)
ServeConfig                 one process's settings (models, threads, queue, batch, timeout, body limit)
Scheduler                   the bounded queue in front of the compute threads (micro-batches, 503 when full)

The service's names load on first use, so `medrank rank` and the stages (which import `steps`) need no web framework.
"""

from __future__ import annotations

from importlib import import_module

_LAZY = {
    "ServeConfig": "medrank.serving.app",
    "create_app": "medrank.serving.app",
    "Overloaded": "medrank.serving.batching",
    "Scheduler": "medrank.serving.batching",
}
__all__ = list(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'medrank.serving' has no attribute {name!r}")
