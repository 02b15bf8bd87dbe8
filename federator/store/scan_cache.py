"""Each shard's last full scan, kept as Arrow while the shard does not change.

A full scan costs a Python step per row (RocksDB iteration); the filters, aggregates and
top-k that run over it are Arrow compute and cost almost nothing. Keeping the scanned
batch lets repeated analytical queries over an unchanged shard skip the iteration. The
entry is keyed by the shard's write sequence, so any write makes it stale: answers are
never older than what the shard holds. Entries are evicted least recently used first,
within a byte budget (``federator node --scan-cache-mb``, 0 turns it off).

What the owner's SQL work made of a cached scan (a partial aggregate, a filter, a top-k) is
kept beside it, keyed by that work's description: it is as deterministic as the scan, so a
repeated aggregate over an unchanged shard costs a lookup. It goes when the scan goes.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import pyarrow as pa

DEFAULT_MB = 256


MAX_DERIVED = 16  # results kept per cached scan (distinct SQL shapes over one shard)


class ScanCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        # owner -> (write sequence, scan, bytes, {work key: result})
        self._entries: OrderedDict[Any, tuple[int, pa.RecordBatch, int, dict[str, pa.RecordBatch]]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, owner: Any, seq: int) -> pa.RecordBatch | None:
        with self._lock:
            entry = self._entries.get(owner)
            if entry is None or entry[0] != seq:
                self.misses += 1
                return None
            self._entries.move_to_end(owner)
            self.hits += 1
            return entry[1]

    def put(self, owner: Any, seq: int, batch: pa.RecordBatch) -> None:
        size = batch.nbytes
        with self._lock:
            self._drop(owner)
            if size > self.max_bytes:
                return
            self._entries[owner] = (seq, batch, size, {})
            self._bytes += size
            self._evict()

    def derived(self, owner: Any, scan: pa.RecordBatch, key: str) -> pa.RecordBatch | None:
        """The result kept for ``key`` over ``scan``, if ``scan`` is still owner's cached scan."""
        with self._lock:
            entry = self._entries.get(owner)
            if entry is None or entry[1] is not scan:
                return None
            return entry[3].get(key)

    def put_derived(self, owner: Any, scan: pa.RecordBatch, key: str, result: pa.RecordBatch) -> None:
        with self._lock:
            entry = self._entries.get(owner)
            if entry is None or entry[1] is not scan or key in entry[3] or len(entry[3]) >= MAX_DERIVED:
                return
            size = result.nbytes
            entry[3][key] = result
            self._entries[owner] = (entry[0], entry[1], entry[2] + size, entry[3])
            self._bytes += size
            self._evict()

    def _evict(self) -> None:
        while self._bytes > self.max_bytes and self._entries:
            self._drop(next(iter(self._entries)))

    def drop(self, owner: Any) -> None:
        with self._lock:
            self._drop(owner)

    def _drop(self, owner: Any) -> None:
        entry = self._entries.pop(owner, None)
        if entry is not None:
            self._bytes -= entry[2]

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"entries": len(self._entries), "bytes": self._bytes, "max_bytes": self.max_bytes,
                    "hits": self.hits, "misses": self.misses}


SCAN_CACHE = ScanCache(DEFAULT_MB << 20)
