"""A content-addressed vector cache in memory, bounded in bytes, shared by every request of one `medrank serve` process.

CHiQA's corpus is fixed, so answers recur across users' questions: a vector computed for one request is reused by the
next (least recently used out first). Keys are the on-disk caches' own (namespace: model fingerprint, precision,
max length; then the text's key), values the stored float16 rows, so a vector read here is the one a cache shard on
disk would hold for the same text. Thread-safe: the service's compute threads share it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterable

import numpy as np


@dataclass
class MemoStats:
    """Counters /metrics reports (texts looked up and found, vectors evicted, bytes held)."""

    hits: int = 0
    misses: int = 0
    evictions: int = 0
    bytes: int = 0
    entries: int = 0


class VectorMemo:
    """`get` / `put` rows by (namespace, key); at most `max_bytes` of vectors held (0: nothing is kept)."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = int(max_bytes)
        self.stats = MemoStats()
        self._rows: OrderedDict[tuple[str, bytes], np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, namespace: str, keys: Iterable[bytes]) -> dict[bytes, np.ndarray]:
        """The rows held for `keys` (a read counts as a use); every key looked up is a hit or a miss."""
        found: dict[bytes, np.ndarray] = {}
        with self._lock:
            for k in keys:
                row = self._rows.get((namespace, k))
                if row is None:
                    self.stats.misses += 1
                    continue
                self._rows.move_to_end((namespace, k))
                found[k] = row
                self.stats.hits += 1
        return found

    def put(self, namespace: str, keys: Iterable[bytes], rows: np.ndarray) -> None:
        """Hold `rows` (one per key, copied), evicting the least recently used beyond max_bytes."""
        with self._lock:
            for k, row in zip(keys, rows):
                item = (namespace, k)
                if item in self._rows:
                    self._rows.move_to_end(item)
                    continue
                row = np.array(row, copy=True)
                if row.nbytes > self.max_bytes:
                    continue
                self._rows[item] = row
                self.stats.bytes += row.nbytes
                while self.stats.bytes > self.max_bytes:
                    _, old = self._rows.popitem(last=False)
                    self.stats.bytes -= old.nbytes
                    self.stats.evictions += 1
            self.stats.entries = len(self._rows)

    def hit_rate(self) -> float | None:
        looked = self.stats.hits + self.stats.misses
        return None if looked == 0 else self.stats.hits / looked
