"""Where an extraction pass computes its shards: forked processes on this machine (`LocalPool`), or Ray Data.

`cached_extract(..., backend=...)` cuts the pairs it must compute into the same shards whatever the backend, and
every backend computes a whole shard with `extract_pairs` (the same length-sorted batches), so the cache content, and
everything downstream, is the in-process path's (tests/encoders/test_embed_cache.py, test_pipeline_smoke.py).

`LocalPool(workers)`: shards on `workers` forked processes, one torch thread each. A MiniLM cross-encoder gains only
1.5x from 1 to 2 threads in one process (its small GEMMs and the attention, LayerNorm and GELU between them do not
split well), yet on the 2-core development machine two one-thread processes computed only 3-6% more pairs/s than one
two-thread process (retrieve 246 -> 262, embed 241 -> 247), and on an AVX2-only EPYC at fp32 embed's exp-run pass
took 260-282 s on two one-thread processes against 322-333 s in one two-thread process, over three paired runs each
(benchmarks/results/experiment-default-2026-11-29-paired-avx2.txt; an earlier benchmark row said the other way: it
gave each worker one shard, the longest pairs all on one).
A batch's outputs do not depend on the thread count, so the bits are the in-process path's
(tests/encoders/test_embed_cache.py) whatever the number of cores. The OpenVINO precisions never fork: one compiled
model runs as many one-thread streams as torch has threads, in this process.

`RayBackend`: each actor loads the saved model from its folder (weights verified against the driver's fingerprint),
computes whole shards with the local batch size, and the driver writes the results into the same content-addressed
cache. `address=None` starts a local Ray on this machine's cores; "auto" or "ray://head:10001" joins an existing
cluster, whose workers need medrank installed and the model folder at the same path (shared storage).
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from medrank.core.errors import MedrankError

log = logging.getLogger(__name__)

Pair = tuple[str, str]


# ---------------------------------------------------------------------- pure batch function
def extract_pairs(encoder: Any, pairs: Sequence[Pair], precision: str, batch_size: int = 64) -> dict[str, np.ndarray]:
    """Probabilities (n, num_labels) float32 and pooled [CLS] vectors (n, H) float16 for a batch of pairs."""
    probs, cls = encoder.predict(
        pairs, batch_size=batch_size, return_embeddings=True, show_progress=False, precision=precision
    )
    return {"probs": probs.astype(np.float32), "cls": cls.astype(np.float16)}


@dataclass(frozen=True)
class RayBackend:
    """Where and how wide: cluster address (None = local Ray), actors, CPUs/GPUs per actor."""

    address: str | None = None
    actors: int = 2
    cpus_per_actor: float = 1.0
    gpus_per_actor: float = 0.0


@dataclass(frozen=True)
class LocalPool:
    """Shards computed side by side by `workers` forked processes with one torch thread each (CPU only)."""

    workers: int


def extraction_backend(backend: str, ray: Any, workers: int | str) -> "LocalPool | RayBackend":
    """The backend an extraction params section names: `backend: local` with its `workers` (auto = every core this
    process may use), or `backend: ray` with its `ray` settings."""
    if backend == "ray":
        return RayBackend(
            address=ray.address, actors=ray.actors, cpus_per_actor=ray.cpus_per_actor, gpus_per_actor=ray.gpus_per_actor
        )
    if workers == "auto":
        workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return LocalPool(max(1, int(workers)))


def forked_workers(backend: "LocalPool | RayBackend", precision: str) -> int | None:
    """What metrics report as `workers`: a LocalPool's processes on the torch path (each of 1 thread, used with >= 2
    shards); None on the OpenVINO path (its streams run in one process, `runtime.openvino_streams`) and on Ray."""
    from medrank.encoders.openvino_path import is_openvino

    return None if is_openvino(precision) else getattr(backend, "workers", None)


_POOL_STATE: dict = {}  # the forked workers' view of the encoder and shards (set before the fork: shared, not pickled)


def _pool_shard(i: int) -> tuple[int, dict[str, np.ndarray]]:
    import torch

    encoder, shards, precision, batch_size = (_POOL_STATE[k] for k in ("encoder", "shards", "precision", "batch_size"))
    torch.set_num_threads(1)
    return i, extract_pairs(encoder, shards[i][1], precision, batch_size)


def pool_extract(
    encoder: Any,
    shards: Sequence[tuple[list[bytes], list[Pair]]],
    precision: str,
    batch_size: int,
    pool: LocalPool,
    put: Callable[[list[bytes], dict[str, np.ndarray]], None],
) -> None:
    """Compute each (keys, pairs) shard and `put(keys, arrays)` its result, in shard order: on `pool.workers` forked
    processes when there are several shards on a CPU, else here (the caller's threads)."""
    from medrank.encoders.openvino_path import is_openvino

    workers = min(pool.workers, len(shards))
    # CUDA cannot be forked; one shard needs no second process; the OpenVINO path runs its own streams (one thread
    # each) in this process: forked one-stream copies would each convert the model again and gain nothing
    if workers <= 1 or encoder.device.type != "cpu" or is_openvino(precision):
        for keys, pairs in shards:
            put(keys, extract_pairs(encoder, pairs, precision, batch_size))
        return
    from medrank.core.forking import fork_pool

    # a lazily loaded encoder reads its weights here (and makes its copy for `precision`), once, before the fork shares them
    encoder.inference_model(precision)
    _POOL_STATE.update(encoder=encoder, shards=shards, precision=precision, batch_size=batch_size)
    try:
        with fork_pool(workers) as procs:  # workers die with this process
            for i, out in procs.imap(
                _pool_shard, range(len(shards))
            ):  # in order: the cache's files are written as here
                put(shards[i][0], out)
    finally:
        _POOL_STATE.clear()


class ExtractActor:
    """One loaded cross-encoder; one call computes one shard (a row of keys and text pairs) with `extract_pairs`."""

    def __init__(
        self, model_dir: str, fingerprint: str, precision: str, batch_size: int, threads: int, device: str
    ) -> None:
        import torch

        from medrank.encoders.cross_encoder import CrossEncoder

        if device == "cpu":
            torch.set_num_threads(max(1, threads))
        self.encoder = CrossEncoder.load(model_dir, device=device, precision=precision)
        if self.encoder.fingerprint != fingerprint:
            raise MedrankError(
                f"{model_dir}: the Ray worker loaded weights {self.encoder.fingerprint[:12]}…, the driver {fingerprint[:12]}…"
            )
        self.precision, self.batch_size = precision, batch_size

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        keys, outs = [], []
        for k, a, b in zip(batch["keys"], batch["a"], batch["b"]):
            keys.extend(bytes(x) for x in k)
            outs.append(extract_pairs(self.encoder, list(zip(a, b)), self.precision, self.batch_size))
        return {"key": np.array(keys, dtype=object), **{c: np.concatenate([o[c] for o in outs]) for c in outs[0]}}


@contextlib.contextmanager
def ray_session(backend: RayBackend) -> Iterator[Any]:
    """`ray` connected to `backend.address` (a local Ray when None); a Ray started here is shut down on exit."""
    try:
        import ray
    except ImportError as e:  # the optional extra
        raise MedrankError('backend ray: Ray is not installed (pip install -e ".[ray]")') from e
    started = not ray.is_initialized()
    if started:
        try:
            ray.init(
                address=backend.address, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False
            )
        except (ConnectionError, ValueError, RuntimeError) as e:  # no cluster at that address, a malformed address
            raise MedrankError(
                f"backend ray: cannot start or join Ray at address {backend.address!r} ({type(e).__name__}: {e})"
            ) from e
    ray.data.DataContext.get_current().enable_progress_bars = (
        False  # the caller's tqdm counts pairs written to the cache
    )
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()


def ray_extract(
    model_dir: str | Path,
    fingerprint: str,
    shards: Sequence[tuple[list[bytes], list[Pair]]],
    precision: str,
    batch_size: int,
    backend: RayBackend,
    put: Callable[[list[bytes], dict[str, np.ndarray]], None],
) -> None:
    """Compute each (keys, pairs) shard on the actor pool and `put(keys, arrays)` every result as it arrives."""
    if not shards:
        return
    device = "cuda" if backend.gpus_per_actor > 0 else "cpu"
    rows = [{"keys": keys, "a": [p[0] for p in pairs], "b": [p[1] for p in pairs]} for keys, pairs in shards]
    with ray_session(backend) as ray:
        ds = ray.data.from_items(rows, override_num_blocks=len(rows))
        out = ds.map_batches(
            ExtractActor,
            fn_constructor_kwargs={
                "model_dir": str(Path(model_dir).resolve()),
                "fingerprint": fingerprint,
                "precision": precision,
                "batch_size": batch_size,
                "threads": int(backend.cpus_per_actor),
                "device": device,
            },
            batch_size=1,
            batch_format="numpy",
            concurrency=min(backend.actors, len(rows)),
            num_cpus=backend.cpus_per_actor,
            num_gpus=backend.gpus_per_actor,
        )  # a pass that fails keeps the shards already written in the cache: a rerun computes only the rest
        for batch in out.iter_batches(batch_size=None, batch_format="numpy"):
            put([bytes(k) for k in batch["key"]], {c: np.asarray(v) for c, v in batch.items() if c != "key"})
