"""The same app as a Ray Serve deployment: `replicas` copies of the service, each a Ray actor with its own models,
its own queue and `threads` torch threads, behind Ray Serve's HTTP proxy (docs/serving.md, "Scale-out").

    python -m medrank.serving.ray_app --replicas 2 --threads 1 [--models models] [--port 8000]

needs the ray extra (`pip install -e ".[ray]"`: ray[serve]; not in the dev extra, whose ray has no serve: a gRPC stack
and more, heavy for CI, so the 2-replica test skips there).
"""

from __future__ import annotations

import argparse
import os
import time

from medrank.core.errors import MedrankError
from medrank.serving.app import ServeConfig, create_app


def deployment(config: ServeConfig, replicas: int = 2):
    """The bound Ray Serve application: `replicas` replicas of create_app(config), each reserving config.threads CPUs
    and taking at most its own queue's worth of requests at once (the rest wait in Ray's proxy, or get its 503)."""
    from ray import serve

    if replicas < 1:
        raise MedrankError(f"replicas must be at least 1, got {replicas}")
    app = create_app(config)

    @serve.deployment(
        name="medrank",
        num_replicas=replicas,
        ray_actor_options={"num_cpus": config.threads or 1},
        max_ongoing_requests=config.max_queue + config.max_batch,
        graceful_shutdown_timeout_s=config.timeout_s,
    )
    @serve.ingress(app)
    class Medrank:
        """One replica: the FastAPI app's lifespan loads the models in the actor, from the driver's folder (relative
        model paths, the encoders under models/base, and data/cache where there is one, as `medrank serve`)."""

        def __init__(self, folder: str) -> None:
            os.chdir(folder)

    return Medrank.bind(os.getcwd())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="medrank serve as a Ray Serve deployment (loopback by default)")
    ap.add_argument("--models", default="models")
    ap.add_argument("--fit", choices=("final", "val"), default="final")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (and Ray CPUs) per replica")
    ap.add_argument("--max-batch", type=int, default=1)
    ap.add_argument("--max-queue", type=int, default=16)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    args = ap.parse_args(argv)
    import ray
    from ray import serve

    config = ServeConfig(
        models=str(args.models), fit=args.fit, threads=args.threads, max_batch=args.max_batch, max_queue=args.max_queue
    )
    ray.init(include_dashboard=False)
    serve.start(http_options={"host": args.host, "port": args.port})
    serve.run(deployment(config, args.replicas), route_prefix="/", name="medrank")
    print(f"medrank on Ray Serve: http://{args.host}:{args.port}/ ({args.replicas} replicas; Ctrl-C stops)", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        serve.shutdown()


if __name__ == "__main__":
    main()
