"""A bounded queue in front of a fixed number of compute threads: the service's only way to the models.

Requests wait in one FIFO queue of at most `max_queue` questions (a full queue refuses at once: `Overloaded`, the
service's 503 with Retry-After); `workers` threads each take up to `max_batch` waiting questions at a time and rank
them in one pass (`max_batch` 1: every question alone, exactly `medrank rank`). The event loop never runs model
code; a question whose caller gave up (timeout, disconnect) before a thread took it is never computed.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Sequence, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


class Overloaded(Exception):
    """The queue is full: come back after `retry_after` seconds."""

    def __init__(self, retry_after: int, queued: int) -> None:
        super().__init__(f"the service is at capacity ({queued} questions waiting); retry in {retry_after} s")
        self.retry_after = retry_after


class Closed(Exception):
    """The service is shutting down and takes no new question."""


@dataclass
class Stats:
    """Counters for /readyz and the access log (read on the event loop; written there too)."""

    completed: int = 0
    rejected: int = 0
    timed_out: int = 0
    failed: int = 0
    batches: dict[int, int] = field(default_factory=dict)  # batch size -> passes
    seconds_per_question: float | None = None  # moving average of a pass's time per question (Retry-After)


@dataclass
class _Job(Generic[T]):
    item: T
    future: asyncio.Future
    queued_at: float


class Scheduler(Generic[T, R]):
    """`run(items) -> results` (same length and order) on `workers` threads, fed from a queue of `max_queue`."""

    def __init__(
        self, run: Callable[[Sequence[T]], Sequence[R]], *, workers: int = 1, max_batch: int = 1, max_queue: int = 16
    ) -> None:
        if workers < 1 or max_batch < 1 or max_queue < 0:
            raise ValueError("workers and max_batch must be >= 1, max_queue >= 0")
        self.run, self.workers, self.max_batch, self.max_queue = run, workers, max_batch, max_queue
        self.stats = Stats()
        self.running = 0  # questions in a pass now
        self._queue: deque[_Job[T]] = deque()
        self._wake: asyncio.Event | None = None
        self._tasks: list[asyncio.Task] = []
        self._pool: ThreadPoolExecutor | None = None
        self._closing = False

    @property
    def queued(self) -> int:
        return len(self._queue)

    def full(self) -> bool:
        return len(self._queue) >= self.max_queue

    def retry_after(self) -> int:
        """Seconds until a place is likely free: the questions ahead of a newcomer over the threads, at the measured
        pace (1 s before anything was measured)."""
        pace = self.stats.seconds_per_question or 1.0
        return max(1, math.ceil(pace * (len(self._queue) + self.running) / self.workers))

    async def start(self) -> None:
        self._wake = asyncio.Event()
        self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="medrank-rank")
        self._tasks = [asyncio.create_task(self._worker(), name=f"medrank-rank-{i}") for i in range(self.workers)]

    async def submit(self, item: T, timeout: float | None) -> tuple[R, dict[str, Any]]:
        """The item's result and its timings (queue_ms, run_ms, batch); Overloaded, Closed or TimeoutError."""
        if self._closing or self._wake is None:
            raise Closed("the service is shutting down")
        if self.full():
            self.stats.rejected += 1
            raise Overloaded(self.retry_after(), len(self._queue))
        job = _Job(item, asyncio.get_running_loop().create_future(), time.perf_counter())
        self._queue.append(job)
        self._wake.set()
        try:
            return await asyncio.wait_for(asyncio.shield(job.future), timeout)
        except (asyncio.TimeoutError, asyncio.CancelledError) as e:
            if not job.future.done():  # still waiting: never computed; running: its result is dropped
                job.future.cancel()
            if isinstance(e, asyncio.TimeoutError):
                self.stats.timed_out += 1
            raise

    async def close(self) -> None:
        """Take no new question, finish every one already queued or running, stop the threads."""
        self._closing = True
        while self._queue or self.running:
            await asyncio.sleep(0.05)
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def _take(self) -> list[_Job[T]]:
        jobs: list[_Job[T]] = []
        while self._queue and len(jobs) < self.max_batch:
            job = self._queue.popleft()
            if not job.future.done():  # its caller gave up while it waited
                jobs.append(job)
        return jobs

    async def _worker(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._wake is not None
        while True:
            jobs = self._take()
            if not jobs:
                self._wake.clear()
                await self._wake.wait()
                continue
            self.running += len(jobs)
            start = time.perf_counter()
            try:
                results = await loop.run_in_executor(self._pool, self.run, [j.item for j in jobs])
                if len(results) != len(jobs):
                    raise RuntimeError(f"{len(results)} results for {len(jobs)} questions")
            except Exception as e:  # handed to each caller, who answers 500 (the traceback is logged there)
                self.stats.failed += len(jobs)
                for j in jobs:
                    if not j.future.done():
                        j.future.set_exception(e)
                continue
            finally:
                self.running -= len(jobs)
            took = time.perf_counter() - start
            per = took / len(jobs)
            avg = self.stats.seconds_per_question
            self.stats.seconds_per_question = per if avg is None else 0.8 * avg + 0.2 * per
            self.stats.batches[len(jobs)] = self.stats.batches.get(len(jobs), 0) + 1
            self.stats.completed += len(jobs)
            for j, r in zip(jobs, results):
                if not j.future.done():
                    timing = {
                        "queue_ms": round((start - j.queued_at) * 1000, 1),
                        "run_ms": round(took * 1000, 1),
                        "batch": len(jobs),
                    }
                    j.future.set_result((r, timing))
