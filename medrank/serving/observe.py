"""What an operator scrapes and reads from `medrank serve`: Prometheus `/metrics` and per-response timing headers.

One registry per app (several apps in one process stay apart): requests by route and status and their latency
(the access-log middleware), each ranked question's queue and compute seconds, and, read at scrape time, the queue
depth, the scheduler's counters, the vector cache's hits and bytes, readiness and the loaded fingerprints (an info
metric). Rank responses carry `Server-Timing` (queue, compute, total) and TEI's `x-queue-time`,
`x-inference-time`, `x-total-time` (milliseconds).
"""

from __future__ import annotations

from typing import Any, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# a question takes ~0.1-10 s on CPU; a refused one a millisecond
_BUCKETS = (0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 1.5, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class ServiceCollector:
    """The service's state, read when /metrics is scraped (nothing to keep in sync)."""

    def __init__(self, svc: Any) -> None:
        self.svc = svc

    def collect(self) -> Iterable[Any]:
        svc = self.svc
        s = svc.scheduler
        yield GaugeMetricFamily(
            "medrank_ready", "1 when the models are loaded, verified and warmed up", value=int(svc.ready)
        )
        yield GaugeMetricFamily(
            "medrank_queue_depth", "questions waiting for a compute thread", value=s.queued if s else 0
        )
        yield GaugeMetricFamily("medrank_running_questions", "questions in a pass now", value=s.running if s else 0)
        yield GaugeMetricFamily(
            "medrank_max_queue", "questions waiting at most (then 503/429)", value=svc.config.max_queue
        )
        stats = s.stats if s else None
        for name, what in (
            ("completed", "questions ranked"),
            ("rejected", "questions refused at capacity"),
            ("timed_out", "questions past the server's timeout"),
            ("failed", "questions whose pass raised"),
        ):
            yield CounterMetricFamily(f"medrank_questions_{name}", what, value=getattr(stats, name, 0) if stats else 0)
        memo = getattr(svc, "memo", None)
        if memo is not None:
            m = memo.stats
            yield CounterMetricFamily(
                "medrank_vector_cache_hits", "texts whose vector an earlier request computed", value=m.hits
            )
            yield CounterMetricFamily("medrank_vector_cache_misses", "texts encoded (not held)", value=m.misses)
            yield CounterMetricFamily(
                "medrank_vector_cache_evictions", "vectors dropped to stay within the bound", value=m.evictions
            )
            yield GaugeMetricFamily("medrank_vector_cache_bytes", "bytes of vectors held", value=m.bytes)
            yield GaugeMetricFamily("medrank_vector_cache_max_bytes", "the cache's bound", value=memo.max_bytes)
            yield GaugeMetricFamily("medrank_vector_cache_entries", "vectors held", value=m.entries)
        if svc.version:
            info = InfoMetricFamily("medrank_model", "the loaded pipeline: commit, fit, system and model fingerprints")
            labels = {
                "medrank": str(svc.version.get("medrank")),
                "commit": str(svc.version.get("commit")),
                "fit": str(svc.version.get("fit")),
                "system": str((svc.version.get("system") or {}).get("system")),
            }
            labels.update({_label(k): str(v) for k, v in (svc.version.get("models") or {}).items()})
            info.add_metric([], labels)
            yield info


def _label(name: str) -> str:
    return "fp_" + "".join(c if c.isalnum() else "_" for c in name)


class Metrics:
    """The app's registry and the instruments the request path updates."""

    def __init__(self, svc: Any) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "medrank_requests", "HTTP requests by route and status", ["route", "status"], registry=self.registry
        )
        self.latency = Histogram(
            "medrank_request_seconds",
            "HTTP request seconds, by route",
            ["route"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.queue = Histogram(
            "medrank_queue_seconds",
            "seconds a question waited for a compute thread",
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.compute = Histogram(
            "medrank_compute_seconds",
            "seconds of the pass that ranked a question",
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(ServiceCollector(svc))

    def observe_request(self, route: str, status: int, seconds: float) -> None:
        self.requests.labels(route, str(status)).inc()
        self.latency.labels(route).observe(seconds)

    def observe_question(self, timing: dict) -> None:
        self.queue.observe(timing["queue_ms"] / 1000)
        self.compute.observe(timing["run_ms"] / 1000)

    def scrape(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


def timing_headers(timings: list[dict], total_ms: float) -> dict[str, str]:
    """Server-Timing and TEI's x-*-time headers of a rank response: the longest wait and pass of its questions."""
    queue = max((t["queue_ms"] for t in timings), default=0.0)
    compute = max((t["run_ms"] for t in timings), default=0.0)
    return {
        "Server-Timing": f"queue;dur={queue:.1f}, compute;dur={compute:.1f}, total;dur={total_ms:.1f}",
        "x-queue-time": str(round(queue)),
        "x-inference-time": str(round(compute)),
        "x-total-time": str(round(total_ms)),
    }
