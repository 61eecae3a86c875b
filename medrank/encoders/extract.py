"""Cached, batched extraction of model outputs: cross-encoder probabilities + [CLS] vectors per text pair, and
bi-encoder vectors per text.

`extract_pairs` is a pure function over a batch of text pairs (in: pairs + a loaded model; out: arrays);
`cached_extract` wraps it with the content-addressed parquet cache so an experiment computes only pairs it has
not seen, one shard at a time: here, on forked processes (`backend=LocalPool(workers)`) or in a Ray Data actor pool
(`backend=RayBackend(...)`), the same shards either way (`medrank.encoders.distributed`). A cache opened `read_only` computes the missing pairs in memory and writes nothing.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from tqdm.auto import tqdm

from medrank.encoders.batching import dedup
from medrank.encoders.cache import PairCache, existing_precisions, namespace_name, pair_key
from medrank.encoders.cross_encoder import CrossEncoder
from medrank.encoders.distributed import LocalPool, RayBackend, extract_pairs, pool_extract, ray_extract
from medrank.encoders.hardware import hardware_precision
from medrank.encoders.sentence_encoder import SentenceEncoder
from medrank.encoders.openvino_path import is_openvino
from medrank.core.errors import MedrankError

log = logging.getLogger(__name__)

Pair = tuple[str, str]


@dataclass
class ExtractStats:
    """What one cached extraction did: requested pairs, unique, found in cache, computed, speed."""

    kind: str
    namespace: str
    precision: str
    pairs: int = 0
    unique: int = 0
    cached: int = 0
    computed: int = 0
    seconds: float = 0.0
    pairs_per_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def choose_precision(
    encoder: CrossEncoder | SentenceEncoder,
    requested: str,
    cache_root: str | os.PathLike,
    kind: str,
    sample_pairs: Sequence[Pair],
) -> str:
    """'auto' reuses the precision of an existing cache for this model (no recompute), else probes; 'openvino-auto'
    is the OpenVINO path at the hardware's precision (flags)."""
    if requested == "openvino-auto":
        return hardware_precision(encoder.device, requested)
    chosen = requested
    if requested == "auto":
        have = [
            p
            for p in existing_precisions(cache_root, kind, encoder.fingerprint, encoder.max_length)
            if (p != "int8" or encoder.device.type == "cpu") and not is_openvino(p)  # auto never picks OpenVINO
        ]
        if not have:
            return encoder.resolve_precision(list(sample_pairs)[:256]) if isinstance(encoder, CrossEncoder) else "fp32"
        chosen = have[0]
        log.info("%s: reusing the cached precision %s (no probe)", kind, chosen)
    return chosen


def open_cache(
    encoder: CrossEncoder, kind: str, cache_root: str | os.PathLike, precision: str, read_only: bool = False
) -> PairCache:
    """The cache namespace of this model at this precision: probs (num_labels) float32 + cls (H) float16."""
    hidden = encoder.hidden_size
    ns = namespace_name(kind, encoder.fingerprint, precision, encoder.max_length)
    meta = {
        "kind": kind,
        "fingerprint": encoder.fingerprint,
        "precision": precision,
        "max_length": encoder.max_length,
        "label_names": list(encoder.label_names),
    }
    return PairCache(
        cache_root, ns, {"probs": ((encoder.num_labels,), np.float32), "cls": ((hidden,), np.float16)}, meta, read_only
    )


def cached_extract(
    encoder: CrossEncoder,
    pairs: Sequence[Pair],
    cache: PairCache,
    precision: str,
    *,
    batch_size: int = 64,
    shard_size: int = 4096,
    desc: str = "extract",
    show_progress: bool = True,
    backend: LocalPool | RayBackend | None = None,
) -> tuple[dict[str, np.ndarray], ExtractStats]:
    """Outputs for `pairs` in input order; only pairs missing from `cache` are computed, one shard per chunk
    (`backend`: None here; LocalPool: the same shards on forked processes; RayBackend: on a Ray actor pool, which
    loads the model from `encoder.path`)."""
    stats = ExtractStats(kind=desc, namespace=cache.dir.name, precision=precision, pairs=len(pairs))
    unique, inverse = dedup([(a, b) for a, b in pairs])
    keys = [pair_key(a, b) for a, b in unique]
    stats.unique = len(unique)
    todo_keys = set(cache.missing(keys))
    todo = [i for i, k in enumerate(keys) if k in todo_keys]
    stats.cached = len(unique) - len(todo)
    # chunks of similar length (longest first): each shard's batches pad little, and the bar's rate is honest
    todo.sort(key=lambda i: -(len(unique[i][0]) + len(unique[i][1])))
    t0 = time.perf_counter()
    chunks = [todo[s : s + shard_size] for s in range(0, len(todo), shard_size)]
    with tqdm(total=len(todo), unit="pair", desc=desc, disable=not show_progress or not todo, smoothing=0.1) as bar:

        def put(chunk_keys: list[bytes], out: dict[str, np.ndarray]) -> None:
            cache.put(chunk_keys, out)
            stats.computed += len(chunk_keys)
            bar.update(len(chunk_keys))

        shards = [([keys[i] for i in c], [unique[i] for i in c]) for c in chunks]
        if isinstance(backend, RayBackend):
            if shards and encoder.path is None:
                raise MedrankError(f"{desc}: backend ray loads the model from its folder; this one was never saved")
            ray_extract(encoder.path, encoder.fingerprint, shards, precision, batch_size, backend, put)
        else:
            pool_extract(encoder, shards, precision, batch_size, backend or LocalPool(1), put)
    stats.seconds = round(time.perf_counter() - t0, 2)
    stats.pairs_per_s = round(stats.computed / stats.seconds, 1) if stats.computed and stats.seconds > 0 else 0.0
    log.info(
        "%s: %d pairs, %d unique, %d cached, %d computed (%.1f pairs/s, %s)",
        desc,
        stats.pairs,
        stats.unique,
        stats.cached,
        stats.computed,
        stats.pairs_per_s,
        precision,
    )
    got = cache.get(keys) if keys else {k: np.zeros((0, *s), d) for k, (s, d) in cache.columns.items()}
    return {k: v[inverse] for k, v in got.items()}, stats


def precision_check(
    encoder: CrossEncoder, pairs: Sequence[Pair], precision: str, batch_size: int = 64
) -> dict[str, float]:
    """max |Δp| (and max |Δcls|) of `precision` against fp32 on a sample of real pairs."""
    if precision == "fp32" or not pairs:
        return {"pairs": 0, "max_abs_prob_diff": 0.0, "max_abs_cls_diff": 0.0}
    ref = extract_pairs(encoder, pairs, "fp32", batch_size)
    got = extract_pairs(encoder, pairs, precision, batch_size)
    return {
        "pairs": len(pairs),
        "max_abs_prob_diff": round(float(np.abs(ref["probs"] - got["probs"]).max()), 6),
        "max_abs_cls_diff": round(
            float(np.abs(ref["cls"].astype(np.float32) - got["cls"].astype(np.float32)).max()), 6
        ),
    }


def cached_precision_check(
    encoder: CrossEncoder,
    pairs: Sequence[Pair],
    precision: str,
    cache_root: str | os.PathLike,
    batch_size: int = 64,
    read_only: bool = False,
) -> dict[str, float]:
    """`precision_check`, kept under `cache_root`/checks/ by everything its result depends on: the weights, the
    precision, the sample pairs, the batch size, and where it runs (CPU flags, ATen's kernel level, torch, threads), so
    an experiment whose sample is the same (stage embed draws it from the N- and T-independent first entailed answers)
    reads it back instead of paying fp32 inference again."""
    import hashlib
    import json

    from medrank.encoders.runtime import runtime_info
    from medrank.core.io import write_json

    if precision == "fp32" or not pairs:
        return precision_check(encoder, pairs, precision, batch_size)
    h = hashlib.sha256()
    ident = (encoder.fingerprint, precision, encoder.max_length, batch_size, runtime_info(encoder.device))
    h.update(json.dumps(ident, sort_keys=True, default=str).encode())
    for a, b in pairs:
        h.update(pair_key(a, b))
    path = Path(cache_root) / "checks" / f"precision-{h.hexdigest()[:32]}.json"
    if path.is_file():
        try:
            got = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(got, dict) and got.get("pairs") == len(pairs):
                log.info("precision check of %s vs fp32: read back from %s", precision, path)
                return got
        except (OSError, ValueError):
            pass
        log.warning("%s: damaged precision check, recomputed", path)  # as a damaged shard is: skipped, never used
    out = precision_check(encoder, pairs, precision, batch_size)
    if not read_only:
        write_json(path, out)
    return out


def cached_sentence_embeddings(
    bi: SentenceEncoder,
    texts: Sequence[str],
    cache_root: str | os.PathLike,
    precision: str,
    batch_size: int = 128,
    shard_size: int | None = 16384,
    read_only: bool = False,
    dtype: type = np.float16,
    kind: str = "bi",
) -> tuple[np.ndarray, ExtractStats]:
    """Bi-encoder vectors (n, H) float32 for `texts`, cached content-addressed like the pairs (stored as `dtype`;
    `kind` names the namespace). The missing texts are encoded in first-appearance order, `shard_size` at a time
    (None: all in one call, the batches `bi.encode` would make of them uncached)."""
    ns = namespace_name(kind, bi.fingerprint, precision, bi.max_length)
    meta = {"kind": kind, "fingerprint": bi.fingerprint, "precision": precision}
    cache = PairCache(cache_root, ns, {"emb": ((bi.hidden,), dtype)}, meta, read_only)
    unique, inverse = dedup(list(texts))
    keys = [pair_key(t, "") for t in unique]
    todo = [i for i, k in enumerate(keys) if k not in cache]
    memo = getattr(bi, "memo", None)  # a served process's vectors of earlier requests (medrank.encoders.memo)
    if memo is not None and todo:
        held = memo.get(ns, [keys[i] for i in todo])
        if held:
            cache.put(list(held), {"emb": np.stack(list(held.values()))})
            todo = [i for i in todo if keys[i] not in held]
    stats = ExtractStats("bi-encoder", ns, precision, len(texts), len(unique), len(unique) - len(todo))
    t0 = time.perf_counter()
    with tqdm(total=len(todo), unit="sent", desc="bi-encoder", disable=not todo, smoothing=0.1) as bar:
        step = shard_size or max(len(todo), 1)
        for s in range(0, len(todo), step):
            chunk = todo[s : s + step]
            emb = bi.encode([unique[i] for i in chunk], precision, batch_size, progress=bar.update)  # per batch
            cache.put([keys[i] for i in chunk], {"emb": emb.astype(dtype)})
            if memo is not None:
                memo.put(ns, [keys[i] for i in chunk], emb.astype(dtype))
            stats.computed += len(chunk)
    stats.seconds = round(time.perf_counter() - t0, 2)
    stats.pairs_per_s = round(stats.computed / stats.seconds, 1) if stats.computed and stats.seconds > 0 else 0.0
    if not keys:
        return np.zeros((len(texts), bi.hidden), dtype=np.float32), stats
    emb = cache.get(keys)["emb"].astype(np.float32)
    return emb[inverse], stats
