"""Each shard's last full scan, kept as Arrow while the shard does not change.

A full scan costs a Python step per row (RocksDB iteration); the filters, aggregates and
top-k that run over it are Arrow compute and cost almost nothing. Keeping the scanned
batch lets repeated analytical queries over an unchanged shard skip the iteration. The
entry is keyed by the shard's write sequence, so any write makes it stale: answers are
never older than what the shard holds. Entries are evicted least recently used first,
within a byte budget (``federator node --scan-cache-mb``, 0 turns it off).

Writes do not simply throw the scan away: the records a shard applies after its scan was
kept are held beside it (up to ``MAX_PENDING``), and the next full scan folds them into the
kept batch when the store type knows how (``StoreType.follow_scan``, kv stores) instead of
reading RocksDB again (``federator node --scan-cache-follow``, 0 turns it off). The cost of
a write thus moves to the next reader, once, not to every write.

What the owner's SQL work made of a cached scan (a partial aggregate, a filter, a top-k) is
kept beside it, keyed by that work's description: it is as deterministic as the scan, so a
repeated aggregate over an unchanged shard costs a lookup. It goes when the scan goes.

Aggregates whose states can be taken back (counts, exact sums) are also kept *maintained*:
a state over the kept scan and the first n pending writes, brought forward by the rows the
later writes removed and added (``federator.sql.incremental``). A COUNT or SUM right after a
write then costs the write's rows, not the shard's, and the scan itself is not folded.
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Sequence

import pyarrow as pa

DEFAULT_MB = 256
MAX_DERIVED = 16  # results kept per cached scan (distinct SQL shapes over one shard)
DEFAULT_FOLLOW = 50_000  # writes held for a kept scan; with more, reading the shard again is cheaper


class Pending:
    """The records a shard applied since its scan was kept: append-only, with where each key
    was written, so a reader holding a length n sees a fixed prefix and finds the record of a
    key before any position without walking the list."""

    def __init__(self) -> None:
        self.records: list[Any] = []
        self._at: dict[bytes, list[int]] = {}

    def __len__(self) -> int:
        return len(self.records)

    def extend(self, records: Sequence[Any]) -> None:
        for i, r in enumerate(records, len(self.records)):
            self._at.setdefault(r.key, []).append(i)
        self.records.extend(records)

    def latest_before(self, key: bytes, n: int) -> Any | None:
        """The last record of ``key`` among the first ``n``, or None."""
        at = self._at.get(key)
        if not at:
            return None
        i = bisect.bisect_left(at, n)
        return self.records[at[i - 1]] if i else None


@dataclass(eq=False)
class _Entry:
    seq: int  # the shard's write sequence the scan reflects
    batch: pa.RecordBatch
    size: int
    derived: dict[str, pa.RecordBatch] = field(default_factory=dict)
    # key -> (pending records reflected, state, the answer made of it)
    maintained: dict[str, tuple[int, pa.Table, pa.RecordBatch]] = field(default_factory=dict)
    pending: Pending = field(default_factory=Pending)  # records applied since, in order
    pending_seq: int | None = None  # the sequence scan + pending reflect


class ScanCache:
    def __init__(self, max_bytes: int, max_pending: int = DEFAULT_FOLLOW) -> None:
        self.max_bytes = max_bytes
        self.max_pending = max_pending
        self._entries: OrderedDict[Any, _Entry] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.followed = 0  # scans brought up to date from pending writes
        self.maintained = 0  # aggregates brought up to date from pending writes

    def get(self, owner: Any, seq: int) -> pa.RecordBatch | None:
        with self._lock:
            entry = self._entries.get(owner)
            if entry is None or entry.seq != seq:
                self.misses += 1
                return None
            self._entries.move_to_end(owner)
            self.hits += 1
            return entry.batch

    def pending(self, owner: Any, seq: int) -> tuple[pa.RecordBatch, list[Any]] | None:
        """The kept scan and the records applied since, when together they reflect ``seq``."""
        with self._lock:
            entry = self._entries.get(owner)
            if entry is None or entry.pending_seq != seq:
                return None
            return entry.batch, entry.pending.records[:]

    def kept(self, owner: Any, seq: int) -> tuple[pa.RecordBatch, Pending, int] | None:
        """The kept scan and the records applied since, of which the first n (maybe none)
        together with the scan reflect ``seq``."""
        with self._lock:
            entry = self._entries.get(owner)
            if entry is None:
                return None
            if entry.pending_seq == seq or (entry.seq == seq and entry.pending_seq is None):
                return entry.batch, entry.pending, len(entry.pending)
            return None

    def state(self, owner: Any, scan: pa.RecordBatch, key: str) -> tuple[int, pa.Table, pa.RecordBatch] | None:
        """The maintained state for ``key`` over ``scan``: (pending records it reflects, state, answer)."""
        with self._lock:
            entry = self._entries.get(owner)
            if entry is None or entry.batch is not scan:
                return None
            return entry.maintained.get(key)

    def put_state(self, owner: Any, scan: pa.RecordBatch, key: str, applied: int, state: pa.Table,
                  answer: pa.RecordBatch, advanced: bool) -> None:
        with self._lock:
            self.maintained += advanced
            entry = self._entries.get(owner)
            if entry is None or entry.batch is not scan:
                return
            old = entry.maintained.get(key)
            if old is not None:
                if old[0] >= applied:
                    return
                freed = old[1].get_total_buffer_size()
                entry.size -= freed
                self._bytes -= freed
            elif len(entry.maintained) >= MAX_DERIVED:
                return
            entry.maintained[key] = (applied, state, answer)
            size = state.get_total_buffer_size()
            entry.size += size
            self._bytes += size
            self._evict()

    def note_writes(self, owner: Any, before: int, after: int, records: Sequence[Any]) -> None:
        """``owner`` went from sequence ``before`` to ``after`` by applying ``records``."""
        with self._lock:
            entry = self._entries.get(owner)
            if entry is None:
                return
            last = entry.pending_seq if entry.pending_seq is not None else entry.seq
            if last != before or len(entry.pending) + len(records) > self.max_pending:
                self._drop(owner)
                return
            entry.pending.extend(records)
            entry.pending_seq = after

    def put(self, owner: Any, seq: int, batch: pa.RecordBatch,
            followed: tuple[pa.RecordBatch, int] | None = None) -> None:
        """Keep ``batch``, owner's full scan at ``seq``: read from the shard, or ``followed``
        = (the kept scan, n) with its first n pending records folded in (maintained states that
        reflect exactly those records carry over)."""
        size = batch.nbytes
        with self._lock:
            old = self._entries.get(owner)
            self._drop(owner)
            if size > self.max_bytes:
                return
            entry = self._entries[owner] = _Entry(seq, batch, size)
            if followed is not None:
                self.followed += 1
                base, folded = followed
                if old is not None and old.batch is base:
                    entry.maintained = {k: (0, st, a) for k, (n, st, a) in old.maintained.items() if n == folded}
                    entry.size += sum(st.get_total_buffer_size() for _, st, _ in entry.maintained.values())
            self._bytes += entry.size
            self._evict()

    def derived(self, owner: Any, scan: pa.RecordBatch, key: str) -> pa.RecordBatch | None:
        """The result kept for ``key`` over ``scan``, if ``scan`` is still owner's cached scan."""
        with self._lock:
            entry = self._entries.get(owner)
            if entry is None or entry.batch is not scan:
                return None
            return entry.derived.get(key)

    def put_derived(self, owner: Any, scan: pa.RecordBatch, key: str, result: pa.RecordBatch) -> None:
        with self._lock:
            entry = self._entries.get(owner)
            if entry is None or entry.batch is not scan or key in entry.derived or len(entry.derived) >= MAX_DERIVED:
                return
            size = result.nbytes
            entry.derived[key] = result
            entry.size += size
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
            self._bytes -= entry.size

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"entries": len(self._entries), "bytes": self._bytes, "max_bytes": self.max_bytes,
                    "hits": self.hits, "misses": self.misses, "followed": self.followed, "maintained": self.maintained}


SCAN_CACHE = ScanCache(DEFAULT_MB << 20)
