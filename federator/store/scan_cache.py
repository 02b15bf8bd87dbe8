"""The scan cache layer: each shard's last full scan, kept as Arrow while the shard does not change.

A full scan costs a Python step per row (RocksDB iteration); the filters, aggregates and
top-k that run over it are Arrow compute and cost almost nothing. Keeping the scanned
batch lets repeated analytical queries over an unchanged shard skip the iteration. The
entry is keyed by the shard's write sequence, so any write makes it stale: answers are
never older than what the shard holds. Entries are evicted least recently used first,
within a byte budget (``federator node --scan-cache-mb``, 0 turns it off). A node makes one
``ScanCache`` from its flags and hands it to each store's ``CachingLayer`` and to the owner's
work (federator.owner) that keeps results beside the scans.

Writes do not simply throw the scan away: the records a shard applies after its scan was
kept are held beside it (up to ``max_pending`` records; their bytes count against the budget
like the scans'), and the next full scan folds them into the
kept batch when the store type knows how (``StoreType.follow_scan``, kv stores) instead of
reading RocksDB again (``federator node --scan-cache-follow``, 0 turns it off). The cost of
a write thus moves to the next reader, once, not to every write.

What the owner's SQL work made of cached scans (a partial aggregate, a filter, a top-k, run
once over all of a node's partitions of the store) is kept too, keyed by that work and the
scans it read: it is as deterministic as they are, so a repeated aggregate over unchanged
shards costs a lookup. It goes when any of its scans goes. When a kept scan is brought up to
date, the rows the writes replaced and added are kept beside it (``steps``, bounded like the
held records), so a kept count or sum can follow them (``derived_since``) instead of being
computed again over every row.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

import pyarrow as pa

from federator.query.position import PositionBound
from federator.query.queries import Query
from federator.store.layer import UNBOUNDED, LocalKeyQuery, StoreLayer, WrappedLayer, answer

if TYPE_CHECKING:
    from federator.query.position import Position
    from federator.store.record import ChangelogRecord

log = logging.getLogger(__name__)

DEFAULT_MB = 256
MAX_DERIVED = 256  # results of owners' SQL kept (distinct SQL shapes over sets of scans)
DEFAULT_FOLLOW = 50_000  # writes held for a kept scan; with more, reading the shard again is cheaper
RECORD_OVERHEAD = 120  # bytes a held record costs beyond its key and value (the Python objects)


def _held_bytes(records: Sequence[Any]) -> int:
    return sum(len(r.key) + len(r.value or b"") + RECORD_OVERHEAD for r in records)


@dataclass(frozen=True)
class _Step:
    """The kept scan went from sequence ``before`` to ``after``: these rows went and came."""
    before: int
    after: int
    removed: pa.RecordBatch
    added: pa.RecordBatch
    nbytes: int


@dataclass(eq=False)
class _Entry:
    seq: int  # the shard's write sequence the scan reflects
    batch: pa.RecordBatch
    size: int  # the scan's and the steps' bytes
    pending: list[Any] = field(default_factory=list)  # records applied since, in order
    pending_seq: int | None = None  # the sequence scan + pending reflect
    pending_bytes: int = 0  # what the held records take, counted against the budget
    steps: tuple[_Step, ...] = ()  # the latest changes folded in, oldest first


@dataclass(frozen=True)
class Since:
    """A kept result of some work over scans, and the rows that have changed in those scans
    since it was made: ``removed`` rows it counted and ``added`` rows it has not."""
    result: pa.RecordBatch
    removed: list[pa.RecordBatch]
    added: list[pa.RecordBatch]


class ScanCache:
    def __init__(self, max_bytes: int, max_pending: int = DEFAULT_FOLLOW) -> None:
        self.max_bytes = max_bytes
        self.max_pending = max_pending
        self._entries: OrderedDict[Any, _Entry] = OrderedDict()
        # (work, owners) -> (the sequence of each scan it read, its result); checked against _entries on use
        self._derived: OrderedDict[tuple[Any, ...], tuple[tuple[int, ...], pa.RecordBatch]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.followed = 0  # scans brought up to date from pending writes
        self.maintained = 0  # kept results brought up to date from the rows that changed

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
            return entry.batch, entry.pending[:]

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
            held = _held_bytes(records)
            entry.pending_bytes += held
            self._bytes += held
            self._evict()  # held writes are memory like the scans: past the budget, the oldest go

    def put(self, owner: Any, seq: int, batch: pa.RecordBatch, change: tuple[pa.RecordBatch, pa.RecordBatch] | None = None) -> None:
        """Keep ``batch``, owner's full scan at ``seq``: read from the shard, or the kept scan
        with the pending records folded in, which changed it by ``change`` (the rows removed,
        the rows added). Results kept over a scan read afresh go; over a followed one they stay,
        to follow the change."""
        with self._lock:
            old = self._entries.get(owner)
            if change is None or old is None:
                self._drop(owner)
                steps: tuple[_Step, ...] = ()
            else:
                self._entries.pop(owner)
                self._bytes -= old.size + old.pending_bytes
                removed, added = change
                steps = _bounded((*old.steps, _Step(old.seq, seq, removed, added, removed.nbytes + added.nbytes)),
                                 self.max_pending)
                self.followed += 1
            size = batch.nbytes + sum(s.nbytes for s in steps)
            if size > self.max_bytes:
                self._drop(owner)
                return
            self._entries[owner] = _Entry(seq, batch, size, steps=steps)
            self._bytes += size
            self._evict()

    def derived(self, scans: Sequence[tuple[Any, pa.RecordBatch]], key: str) -> pa.RecordBatch | None:
        """The result kept for work ``key`` over ``scans`` ((owner, batch) pairs), if each batch
        is still its owner's cached scan and the result was made over it."""
        with self._lock:
            dkey = (key, *(owner for owner, _ in scans))
            kept = self._derived.get(dkey)
            if kept is None or not self._current(scans):
                return None
            seqs, result = kept
            if any(seq != self._entries[owner].seq for seq, (owner, _) in zip(seqs, scans)):
                return None
            self._derived.move_to_end(dkey)
            return result

    def derived_since(self, scans: Sequence[tuple[Any, pa.RecordBatch]], key: str) -> Since | None:
        """The result last kept for work ``key`` over these owners' scans, and the rows changed
        in each since it was made, when each batch is its owner's cached scan and its steps
        reach back that far."""
        with self._lock:
            kept = self._derived.get((key, *(owner for owner, _ in scans)))
            if kept is None or not self._current(scans):
                return None
            seqs, result = kept
            removed: list[pa.RecordBatch] = []
            added: list[pa.RecordBatch] = []
            for seq, (owner, _) in zip(seqs, scans):
                entry = self._entries[owner]
                if seq == entry.seq:
                    continue
                first = next((i for i, s in enumerate(entry.steps) if s.before == seq), None)
                if first is None:
                    return None
                for s in entry.steps[first:]:
                    removed.append(s.removed)
                    added.append(s.added)
            return Since(result, removed, added)

    def put_derived(self, scans: Sequence[tuple[Any, pa.RecordBatch]], key: str, result: pa.RecordBatch,
                    maintained: bool = False) -> None:
        """Keep ``result`` of work ``key`` over ``scans``; ``maintained``: it was brought up to
        date from the rows that changed (counted in the stats)."""
        with self._lock:
            if not scans or not self._current(scans):
                return
            dkey = (key, *(owner for owner, _ in scans))
            self._drop_derived(dkey)
            self._derived[dkey] = (tuple(self._entries[owner].seq for owner, _ in scans), result)
            self._bytes += result.nbytes
            if maintained:
                self.maintained += 1
            while len(self._derived) > MAX_DERIVED:
                self._drop_derived(next(iter(self._derived)))
            self._evict()

    def _current(self, scans: Sequence[tuple[Any, pa.RecordBatch]]) -> bool:
        for owner, batch in scans:
            entry = self._entries.get(owner)
            if entry is None or entry.batch is not batch:
                return False
        return True

    def _drop_derived(self, dkey: tuple[Any, ...]) -> None:
        kept = self._derived.pop(dkey, None)
        if kept is not None:
            self._bytes -= kept[1].nbytes

    def _evict(self) -> None:
        while self._bytes > self.max_bytes and self._derived:  # cheaper to make again than a scan
            self._drop_derived(next(iter(self._derived)))
        while self._bytes > self.max_bytes and self._entries:
            self._drop(next(iter(self._entries)))

    def drop(self, owner: Any) -> None:
        with self._lock:
            self._drop(owner)

    def _drop(self, owner: Any) -> None:
        entry = self._entries.pop(owner, None)
        if entry is not None:
            self._bytes -= entry.size + entry.pending_bytes
            for dkey in [k for k in self._derived if owner in k[1:]]:
                self._drop_derived(dkey)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"entries": len(self._entries), "derived": len(self._derived), "bytes": self._bytes, "max_bytes": self.max_bytes,
                    "hits": self.hits, "misses": self.misses, "followed": self.followed, "maintained": self.maintained}


def _bounded(steps: tuple[_Step, ...], max_rows: int) -> tuple[_Step, ...]:
    """The latest steps whose rows add up to at most ``max_rows``: a result older than those is
    made again, which past that many changed rows costs less than following them."""
    rows, keep = 0, len(steps)
    while keep > 0:
        s = steps[keep - 1]
        rows += s.removed.num_rows + s.added.num_rows
        if rows > max_rows:
            break
        keep -= 1
    return steps[keep:]


class CachingLayer(WrappedLayer):
    """The scan cache as a store layer: answers a full scan from ``cache`` (kept, or brought up
    to date from the writes since) through the shard's optimistic read, keeps what it read,
    and passes every other query down. Writes pass through it to the shard and are noted
    for the kept scan to follow."""

    def __init__(self, inner: StoreLayer, cache: ScanCache) -> None:
        super().__init__(inner)
        self.cache = cache
        self._shard = inner.base  # the cache's key for this store's entries

    def run(self, query: Query, bound: PositionBound = UNBOUNDED, collect_execution_info: bool = False) -> Any:
        shard = self._shard
        if type(query) is LocalKeyQuery or not shard.store_type.is_full_scan(query):
            return self.inner.run(query, bound, collect_execution_info)
        return answer(shard, query, bound, collect_execution_info, lambda: self._full_scan(query))

    def _full_scan(self, query: Query) -> tuple[pa.RecordBatch, Position]:
        shard = self._shard
        handler, view = shard.handler(query), shard._view()

        def scan(query: Query) -> tuple[pa.RecordBatch, bool]:
            # the sequence read here is the one consistent() returns whenever this read counts
            kept = self._kept_scan(shard.seq)
            if kept is not None:
                return kept, False
            return handler(view, query), True

        (batch, read), position, seq = shard.consistent(scan, query)
        if read:
            self.cache.put(shard, seq, batch)
        return batch, position

    def _kept_scan(self, seq: int) -> pa.RecordBatch | None:
        """The full scan at ``seq`` from the cache, folding in writes held since it was kept."""
        shard, cache = self._shard, self.cache
        batch = cache.get(shard, seq)
        if batch is not None:
            return batch
        pending = cache.pending(shard, seq)
        if pending is None:
            return None
        try:
            followed = shard.store_type.follow_scan(shard.definition, shard.schema, *pending)
        except Exception:  # noqa: BLE001 - a record that does not decode: the full scan says so properly
            log.warning("store %r partition %s: could not bring the kept scan up to date; reading the shard",
                        shard.definition.name, shard.partition, exc_info=True)
            followed = None
        if followed is None:
            cache.drop(shard)
            return None
        cache.put(shard, seq, followed.batch, (followed.removed, followed.added))
        return followed.batch

    def apply(self, records: Sequence[ChangelogRecord]) -> tuple[int, int]:
        before, after = self.inner.apply(records)
        if after != before:  # the write landed: a kept scan can follow it
            self.cache.note_writes(self._shard, before, after, records)
        return before, after

    def reset(self, source: str | None = None) -> None:
        self.inner.reset(source)
        self.cache.drop(self._shard)

    def close(self) -> None:
        self.inner.close()
        self.cache.drop(self._shard)
