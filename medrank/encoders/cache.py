"""Content-addressed, append-only parquet cache of model outputs per text pair (kill -9 safe, resumable).

A cache directory holds one folder per namespace (model fingerprint + precision + max_length); each folder
holds immutable shards `part-*.parquet`, each written to a temp file and renamed into place, so a killed run
leaves only whole shards (temp files are never read and are swept on open). Keys are a 16-byte BLAKE2b of
the text pair, so the same pair is computed once whatever experiment asks for it.

Opened `read_only`, a cache reads the shards it finds and keeps what is put in memory: it creates, writes and
deletes nothing (`medrank rank` must not touch the DVC-tracked cache folders).

Every shard carries the sha256 of its keys and values in its parquet metadata (`medrank.sha256`), checked when the
cache is opened: a shard that fails (flipped bytes, a torn write, an undecodable page, another schema) or that is a
link to a file outside the project and the DVC cache is skipped, so its pairs are computed again; never fatal. Shards
written before checksums existed are read and decoded whole (a damaged one is skipped the same way) and counted as
`unverified` in `info()`. The checksum guards against damage, not against someone who can write a whole valid shard.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import time
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from medrank.core.errors import MedrankError
from medrank.core.io import atomic_path, write_json

log = logging.getLogger(__name__)

KEY_BYTES = 16
SHARD_GLOB = "part-*.parquet"
META_FILE = "namespace.json"
DIGEST_KEY = b"medrank.sha256"
_counter = itertools.count()


def shard_digest(keys: Sequence[bytes], arrays: Mapping[str, np.ndarray]) -> str:
    """sha256 over a shard's keys and its value arrays (in column order, as stored)."""
    h = hashlib.sha256()
    h.update(b"".join(keys))
    for name, arr in arrays.items():
        h.update(name.encode())
        h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()


def _outside(shard: Path) -> bool:
    """A shard that is a link to somewhere other than this project or a DVC cache (`.../files/md5/...`)."""
    if not shard.is_symlink():
        return False
    target = shard.resolve()
    return not (target.is_relative_to(Path.cwd().resolve()) or "/files/md5/" in target.as_posix())


def pair_key(a: str, b: str) -> bytes:
    """16-byte content address of an ordered text pair (length-prefixed, so ('ab','c') != ('a','bc'))."""
    h = hashlib.blake2b(digest_size=KEY_BYTES)
    for s in (a, b):
        data = s.encode("utf-8")
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.digest()


def namespace_name(kind: str, fingerprint: str, precision: str, max_length: int) -> str:
    """Folder name of one model's outputs: what changes the numbers (weights, precision, truncation)."""
    return f"{kind}-{fingerprint[:20]}-{precision}-L{int(max_length)}"


def existing_precisions(root: str | os.PathLike, kind: str, fingerprint: str, max_length: int) -> list[str]:
    """Precisions that already have shards for this model under `root` (most shards first)."""
    root = Path(root)
    prefix = f"{kind}-{fingerprint[:20]}-"
    found = []
    if root.is_dir():
        for d in root.iterdir():
            if d.is_dir() and d.name.startswith(prefix) and d.name.endswith(f"-L{int(max_length)}"):
                n = sum(1 for _ in d.glob(SHARD_GLOB))
                if n:
                    found.append((n, d.name[len(prefix) :].rsplit("-L", 1)[0]))
    return [p for _, p in sorted(found, reverse=True)]


def _arrow_type(value_shape: tuple[int, ...], dtype: np.dtype) -> pa.DataType:
    base = pa.from_numpy_dtype(np.dtype(dtype))
    return pa.list_(base, int(np.prod(value_shape))) if value_shape else base


class PairCache:
    """Append-only store: `missing(keys)`, `put(keys, arrays)` (one atomic shard), `get(keys)` → arrays.

    `columns` maps a column name to (per-row shape, numpy dtype), e.g. {"cls": ((384,), float16)}.
    `read_only`: no folder, shard, metadata or temp-file sweep is written; `put` keeps the rows in memory.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        namespace: str,
        columns: Mapping[str, tuple[tuple[int, ...], np.dtype]],
        meta: Mapping[str, object] | None = None,
        read_only: bool = False,
    ) -> None:
        self.dir = Path(root) / namespace
        self.columns = {k: (tuple(shape), np.dtype(dt)) for k, (shape, dt) in columns.items()}
        self.schema = pa.schema(
            [("key", pa.binary(KEY_BYTES))] + [(k, _arrow_type(s, d)) for k, (s, d) in self.columns.items()]
        )
        self._index: dict[bytes, tuple[Path, int]] = {}
        self._loaded: dict[Path, dict[str, np.ndarray]] = {}
        self._seen: set[Path] = set()
        self._memory: set[Path] = set()  # read-only: rows put in this process, never on disk
        self.skipped: list[str] = []  # shards that failed their check (their pairs are computed again)
        self.unverified = 0  # shards written before checksums (decoded whole, no sha256 to compare)
        self.read_only = read_only
        if not read_only:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._sweep_temp()
            meta_path = self.dir / META_FILE
            if meta is not None and not meta_path.exists():
                write_json(meta_path, {**meta, "columns": {k: [list(s), str(d)] for k, (s, d) in self.columns.items()}})
        self.refresh()

    # ------------------------------------------------------------------ index
    def _sweep_temp(self) -> None:
        # temp files of a killed writer: never renamed, so never part of the cache
        for tmp in self.dir.glob(".part-*.tmp"):
            try:
                if time.time() - tmp.stat().st_mtime > 60:  # leave a live writer's file alone
                    tmp.unlink()
            except OSError:
                pass

    def refresh(self) -> None:
        """Index shards written since the last refresh (another process may have added some)."""
        for shard in sorted(self.dir.glob(SHARD_GLOB)):
            if shard in self._seen:
                continue
            self._seen.add(shard)
            try:
                if _outside(shard):
                    raise ValueError(f"a link to {shard.resolve()}, outside the project and the DVC cache")
                table = pq.read_table(shard)
                if table.schema.remove_metadata() != self.schema:
                    raise ValueError("schema differs")
                keys = table.column("key").to_pylist()
                recorded = (table.schema.metadata or {}).get(DIGEST_KEY)
                arrays = {name: self._column(table, name) for name in self.columns}  # decodes every page
                if recorded is None:
                    self.unverified += 1
                elif recorded.decode() != shard_digest(keys, arrays):
                    raise ValueError("content differs from its sha256")
            except Exception as e:  # a damaged or foreign shard is skipped (its pairs computed again), never fatal
                log.warning(
                    "cache shard %s skipped: its pairs are computed again (%s: %s)", shard.name, type(e).__name__, e
                )
                self.skipped.append(shard.name)
                continue
            for row, k in enumerate(keys):
                self._index.setdefault(k, (shard, row))

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, key: bytes) -> bool:
        return key in self._index

    def keys(self) -> list[bytes]:
        """Every key held (whatever shard it sits in), sorted: two caches with the same content list the same keys."""
        return sorted(self._index)

    @property
    def shards(self) -> list[Path]:
        return sorted({s for s, _ in self._index.values() if s not in self._memory})

    def missing(self, keys: Iterable[bytes]) -> list[bytes]:
        """Keys not in the cache, unique, in first-seen order."""
        out: dict[bytes, None] = {}
        for k in keys:
            if k not in self._index:
                out.setdefault(k, None)
        return list(out)

    # ------------------------------------------------------------------ write
    def put(self, keys: Sequence[bytes], arrays: Mapping[str, np.ndarray]) -> Path | None:
        """Write one shard atomically (temp + rename); keys already cached are dropped. Returns the shard
        (None when nothing was new, or when read-only: the rows are then kept in memory)."""
        keys = list(keys)
        n = len(keys)
        for name, (shape, dt) in self.columns.items():
            arr = arrays.get(name)
            if arr is None or arr.shape != (n, *shape):
                got = None if arr is None else arr.shape
                raise MedrankError(f"cache put: column '{name}' has shape {got}, expected {(n, *shape)}")
        fresh = [i for i, k in enumerate(keys) if k not in self._index]
        fresh = list({keys[i]: i for i in fresh}.values())  # duplicates within the batch: keep one
        if not fresh:
            return None
        idx = np.asarray(fresh)
        if self.read_only:
            where = self.dir / f"<memory-{next(_counter):06d}>"
            self._memory.add(where)
            self._loaded[where] = {
                name: np.ascontiguousarray(arrays[name][idx].astype(dt, copy=False))
                for name, (_, dt) in self.columns.items()
            }
            for row, i in enumerate(fresh):
                self._index[keys[i]] = (where, row)
            return None
        new_keys = [keys[i] for i in fresh]
        cols = [pa.array(new_keys, type=pa.binary(KEY_BYTES))]
        stored = {}
        for name, (shape, dt) in self.columns.items():
            arr = stored[name] = np.ascontiguousarray(arrays[name][idx].astype(dt, copy=False))
            flat = pa.array(arr.reshape(-1))
            cols.append(pa.FixedSizeListArray.from_arrays(flat, int(np.prod(shape))) if shape else flat)
        schema = self.schema.with_metadata({DIGEST_KEY: shard_digest(new_keys, stored).encode()})
        table = pa.Table.from_arrays(cols, schema=schema)
        shard = self.dir / f"part-{time.time_ns():020d}-{os.getpid()}-{next(_counter):06d}.parquet"
        # atomic_path: temp file beside the shard, renamed only after the write completed
        with atomic_path(shard) as tmp:
            pq.write_table(table, tmp, compression="zstd")
        self._seen.add(shard)
        for row, i in enumerate(fresh):
            self._index[keys[i]] = (shard, row)
        self._loaded[shard] = {name: self._column(table, name) for name in self.columns}
        return shard

    # ------------------------------------------------------------------ read
    def _column(self, table: pa.Table, name: str) -> np.ndarray:
        shape, dt = self.columns[name]
        col = table.column(name).combine_chunks()
        if shape:
            col = col.flatten()
        return col.to_numpy(zero_copy_only=False).astype(dt, copy=False).reshape(len(table), *shape)

    def _shard_arrays(self, shard: Path) -> dict[str, np.ndarray]:
        if shard not in self._loaded:
            table = pq.read_table(shard, columns=list(self.columns))
            self._loaded[shard] = {name: self._column(table, name) for name in self.columns}
        return self._loaded[shard]

    def get(self, keys: Sequence[bytes]) -> dict[str, np.ndarray]:
        """Arrays (len(keys), *shape) per column, in the order of `keys`; every key must be cached."""
        n = len(keys)
        out = {name: np.zeros((n, *shape), dtype=dt) for name, (shape, dt) in self.columns.items()}
        by_shard: dict[Path, tuple[list[int], list[int]]] = {}
        for i, k in enumerate(keys):
            loc = self._index.get(k)
            if loc is None:
                raise MedrankError(f"cache {self.dir.name}: key {k.hex()} not cached")
            dst, src = by_shard.setdefault(loc[0], ([], []))
            dst.append(i)
            src.append(loc[1])
        for shard, (dst, src) in by_shard.items():
            arrays = self._shard_arrays(shard)
            for name in self.columns:
                out[name][dst] = arrays[name][src]
        return out

    def release(self) -> None:
        """Drop loaded shard arrays (memory; rows only held in memory stay); the key index stays."""
        self._loaded = {k: v for k, v in self._loaded.items() if k in self._memory}

    def info(self) -> dict[str, object]:
        meta_path = self.dir / META_FILE
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
        return {
            "namespace": self.dir.name,
            "rows": len(self),
            "shards": len(self.shards),
            "skipped_shards": len(self.skipped),
            "unverified_shards": self.unverified,
            **meta,
        }
