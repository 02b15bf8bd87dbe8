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
write sequences of the scans it read: it is as deterministic as they are, so a repeated
aggregate over unchanged shards costs a lookup. It goes when any of its scans goes.

Each held write also keeps what its keys held before it (``StoreType.stored_before``), and
stays beside the scan after it is folded in (``history``, bounded like the held records), so
the rows any kept result has not seen are known: the rows its keys held then and hold now
(``changes_since``). A count or a sum follows those alone (federator.owner.maintained), with
or without the scan itself being brought up to date.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

import pyarrow as pa

from federator.query.position import PositionBound
from federator.query.queries import Query
from federator.settings import NodeSettings
from federator.store.layer import UNBOUNDED, LocalKeyQuery, StoreLayer, WrappedLayer, answer
from federator.store.types import stored_value

if TYPE_CHECKING:
    from federator.query.position import Position
    from federator.store.record import ChangelogRecord

log = logging.getLogger(__name__)

DEFAULT_MB = NodeSettings.scan_cache_mb
MAX_DERIVED = 256  # results of owners' SQL kept (distinct SQL shapes over sets of scans)
DEFAULT_FOLLOW = NodeSettings.scan_cache_follow  # writes held for a kept scan; with more, reading the shard again is cheaper
RECORD_OVERHEAD = 120  # bytes a held record costs beyond its key and value (the Python objects)


def _held_bytes(records: Sequence[Any], before: Sequence[bytes | None] | None) -> int:
    held = sum(len(r.key) + len(r.value or b"") + RECORD_OVERHEAD for r in records)
    return held + (sum(len(v) for v in before if v is not None) if before is not None else 0)


RowsOf = Callable[[Sequence[bytes], Sequence[bytes]], pa.RecordBatch]  # stored keys and values -> rows


@dataclass(frozen=True)
class _Write:
    """One write applied to a shard after its scan was kept: the sequence it went from and to,
    its records, and what their keys held before it (None: the store type does not tell)."""
    before: int
    after: int
    records: Sequence[Any]
    stored_before: Sequence[bytes | None] | None
    nbytes: int


@dataclass(eq=False)
class _Entry:
    seq: int  # the shard's write sequence the scan reflects
    batch: pa.RecordBatch
    size: int  # the scan's bytes
    rows_of: RowsOf | None = None  # the rows of stored entries, in the scan's schema
    pending: list[_Write] = field(default_factory=list)  # applied since the scan, in order
    history: list[_Write] = field(default_factory=list)  # folded into the scan, kept for older results
    held: int = 0  # what pending and history take, counted against the budget
    pending_records: int = 0  # records in pending, checked against max_pending on every write

    @property
    def pending_seq(self) -> int | None:
        """The sequence the scan and the pending writes reflect together."""
        return self.pending[-1].after if self.pending else None

    @property
    def current(self) -> int:
        return self.pending[-1].after if self.pending else self.seq

    def writes(self, since: int, upto: int) -> list[_Write] | None:
        """The writes that took the shard from ``since`` to ``upto``, when they are all held
        (one after another, each from the sequence the one before left)."""
        if since == upto:
            return []
        # searched from the newest: a result is usually followed from a recent write, and the
        # history may hold thousands of small ones (sequences only grow along the list)
        held = len(self.history)
        for i in range(held + len(self.pending) - 1, -1, -1):
            w = self.pending[i - held] if i >= held else self.history[i]
            if w.before < since:
                return None
            if w.before == since:
                writes = self.history[i:] + self.pending if i < held else self.pending[i - held:]
                for j, later in enumerate(writes):
                    if j and later.before != writes[j - 1].after:
                        return None  # a write between them is not held
                    if later.after == upto:
                        return writes[:j + 1]
                return None
        return None


@dataclass(frozen=True)
class Changes:
    """What some writes changed: the entries their keys held before (``gone``, as stored) and
    hold now (``live``), and how stored entries become rows."""
    gone: list[tuple[bytes, bytes]]
    live: list[tuple[bytes, bytes]]
    rows_of: RowsOf | None


def _changes(writes: list[_Write], rows_of: RowsOf | None) -> Changes | None:
    if not writes:
        return Changes([], [], rows_of)
    if rows_of is None or any(w.stored_before is None for w in writes):
        return None
    first: dict[bytes, bytes | None] = {}  # what each key held before the first write to it
    last: dict[bytes, Any] = {}  # its last record
    for w in writes:
        for r, held in zip(w.records, w.stored_before):  # type: ignore[arg-type]
            first.setdefault(r.key, held)
            last[r.key] = r
    return Changes([(k, v) for k, v in first.items() if v is not None],
                   [(k, stored_value(r)) for k, r in last.items() if r.value is not None], rows_of)


@dataclass(frozen=True)
class Since:
    """A kept result of some work over scans, and the rows that changed in those scans since it
    was made: ``removed`` rows it counted and ``added`` rows it has not."""
    result: pa.RecordBatch
    removed: list[pa.RecordBatch]
    added: list[pa.RecordBatch]

    @classmethod
    def of(cls, result: pa.RecordBatch, changes: Sequence[Changes]) -> Since:
        """With the changes of one store's partitions, made rows together (they share a schema)."""
        rows_of = next((c.rows_of for c in changes if c.rows_of is not None), None)
        gone = [e for c in changes for e in c.gone]
        live = [e for c in changes for e in c.live]

        def rows(entries: list[tuple[bytes, bytes]]) -> list[pa.RecordBatch]:
            if not entries or rows_of is None:
                return []
            return [rows_of([k for k, _ in entries], [v for _, v in entries])]

        return cls(result, rows(gone), rows(live))


class ScanCache:
    def __init__(self, max_bytes: int, max_pending: int = DEFAULT_FOLLOW) -> None:
        self.max_bytes = max_bytes
        self.max_pending = max_pending
        self._entries: OrderedDict[Any, _Entry] = OrderedDict()
        # (work, owners) -> (the sequence each owner's scan was at, the result)
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
            return entry.batch, [r for w in entry.pending for r in w.records]

    def follows(self, owner: Any) -> bool:
        """Whether a scan of ``owner`` is kept (its writes are worth noting, with what they replace)."""
        return owner in self._entries

    def note_writes(self, owner: Any, before: int, after: int, records: Sequence[Any],
                    stored_before: Sequence[bytes | None] | None = None) -> None:
        """``owner`` went from sequence ``before`` to ``after`` by applying ``records``, whose
        keys held ``stored_before`` until then."""
        with self._lock:
            entry = self._entries.get(owner)
            if entry is None:
                return
            if entry.current != before or entry.pending_records + len(records) > self.max_pending:
                self._drop(owner)
                return
            held = _held_bytes(records, stored_before)
            entry.pending.append(_Write(before, after, records, stored_before, held))
            entry.pending_records += len(records)
            entry.held += held
            self._bytes += held
            self._evict()  # held writes are memory like the scans: past the budget, the oldest go

    def put(self, owner: Any, seq: int, batch: pa.RecordBatch, followed: bool = False,
            rows_of: RowsOf | None = None) -> None:
        """Keep ``batch``, owner's full scan at ``seq``: read from the shard (``rows_of`` makes
        rows of its stored entries), or (``followed``) the kept scan with the pending writes
        folded in. Results kept over a scan read afresh go; over a followed one they stay, to
        follow the writes it folded in (kept in its history)."""
        size = batch.get_total_buffer_size()
        with self._lock:
            old = self._entries.get(owner)
            if not followed or old is None or old.pending_seq != seq:
                self._drop(owner)
                entry = _Entry(seq, batch, size, rows_of)
            else:
                self._entries.pop(owner)
                self._bytes -= old.size + old.held
                history = _bounded(old.history + old.pending, self.max_pending)
                entry = _Entry(seq, batch, size, old.rows_of, history=history, held=sum(w.nbytes for w in history))
                self.followed += 1
            if size + entry.held > self.max_bytes:
                self._drop(owner)
                return
            self._entries[owner] = entry
            self._bytes += size + entry.held
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

    def kept_result(self, key: str, owners: Sequence[Any]) -> tuple[tuple[int, ...], pa.RecordBatch] | None:
        """The result last kept for work ``key`` over ``owners``, with the sequences it reflects."""
        with self._lock:
            return self._derived.get((key, *owners))

    def changes_since(self, owner: Any, since: int, seq: int) -> Changes | None:
        """The rows ``owner``'s writes from sequence ``since`` to ``seq`` (its sequence now)
        replaced and left, when its scan is kept and they are all held: what a result made at
        ``since`` lacks, without the scan being brought up to date."""
        with self._lock:
            entry = self._entries.get(owner)
            if entry is None or entry.current != seq:
                return None
            writes = entry.writes(since, seq)
            rows_of = entry.rows_of
        return None if writes is None else _changes(writes, rows_of)

    def put_derived(self, scans: Sequence[tuple[Any, pa.RecordBatch]], key: str, result: pa.RecordBatch) -> None:
        """Keep ``result`` of work ``key`` over ``scans``."""
        with self._lock:
            if not scans or not self._current(scans):
                return
            self._keep_derived([o for o, _ in scans], key, tuple(self._entries[o].seq for o, _ in scans), result,
                               False)

    def put_derived_at(self, owners: Sequence[Any], key: str, seqs: tuple[int, ...], result: pa.RecordBatch) -> None:
        """Keep ``result`` of work ``key``, brought up to date from the rows that changed, as of
        each owner's sequence ``seqs`` (read with its position, so the result reflects exactly that)."""
        with self._lock:
            if all(o in self._entries for o in owners):
                self._keep_derived(list(owners), key, seqs, result, True)

    def _keep_derived(self, owners: list[Any], key: str, seqs: tuple[int, ...], result: pa.RecordBatch,
                      maintained: bool) -> None:
        dkey = (key, *owners)
        self._drop_derived(dkey)
        self._derived[dkey] = (seqs, result)
        self._bytes += result.get_total_buffer_size()
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
            self._bytes -= kept[1].get_total_buffer_size()

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
            self._bytes -= entry.size + entry.held
            for dkey in [k for k in self._derived if owner in k[1:]]:
                self._drop_derived(dkey)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"entries": len(self._entries), "derived": len(self._derived), "bytes": self._bytes, "max_bytes": self.max_bytes,
                    "hits": self.hits, "misses": self.misses, "followed": self.followed, "maintained": self.maintained}


def _bounded(writes: list[_Write], max_records: int) -> list[_Write]:
    """The latest writes whose records add up to at most ``max_records``: a result older than
    those is made again, which past that many changed rows costs less than following them."""
    records, keep = 0, len(writes)
    while keep > 0:
        records += len(writes[keep - 1].records)
        if records > max_records:
            break
        keep -= 1
    return writes[keep:]


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
            self.cache.put(shard, seq, batch, rows_of=functools.partial(
                shard.store_type.stored_rows, shard.definition, shard.schema))
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
            batch = shard.store_type.follow_scan(shard.definition, shard.schema, *pending)
        except Exception:  # noqa: BLE001 - a record that does not decode: the full scan says so properly
            log.warning("store %r partition %s: could not bring the kept scan up to date; reading the shard",
                        shard.definition.name, shard.partition, exc_info=True)
            batch = None
        if batch is None:
            cache.drop(shard)
            return None
        cache.put(shard, seq, batch, followed=True)
        return batch

    def changes_since(self, since: int, bound: PositionBound = UNBOUNDED) -> tuple[Changes, Position, int] | None:
        """The rows this store's writes since sequence ``since`` replaced and left, with the
        position and sequence they brought it to, from the writes held beside its kept scan
        (the scan is not brought up to date); None when they are not all held or the position
        is short of ``bound``."""
        shard, cache = self._shard, self.cache
        changes, position, seq = shard.consistent(lambda s: cache.changes_since(shard, s, shard.seq), since)
        if changes is None or not bound.is_satisfied_by(position, shard.topic, shard.partition):
            return None
        return changes, position, seq

    def apply(self, records: Sequence[ChangelogRecord], through: int | None = None) -> tuple[int, int]:
        shard = self._shard
        # read before the write by the shard's one writer (this call), so nothing moves between
        held = shard.stored_before(records) if self.cache.follows(shard) and records else None
        before, after = self.inner.apply(records, through)
        if after != before:  # the write landed: a kept scan can follow it
            self.cache.note_writes(shard, before, after, records, held)
        return before, after

    def reset(self, source: str | None = None) -> None:
        self.inner.reset(source)
        self.cache.drop(self._shard)

    def close(self) -> None:
        self.inner.close()
        self.cache.drop(self._shard)
