"""`medrank serve`: the trained pipeline as an HTTP service (FastAPI + uvicorn; docs/serving.md).

create_app(config, ranker)  the ASGI app: POST /rank, /rank/batch; GET /healthz, /readyz, /version, / (a form)
ServeConfig                 one process's settings (models, threads, queue, batch, timeout, body limit)
Scheduler                   the bounded queue in front of the compute threads (micro-batches, 503 when full)
"""

from medrank.serving.app import ServeConfig, create_app
from medrank.serving.batching import Overloaded, Scheduler

__all__ = ["ServeConfig", "create_app", "Overloaded", "Scheduler"]
