"""The bottom layer of a store: one partition on disk, a RocksDB database whose data and
Position change in one write (federator.store.layer describes the stack above it)."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import operator
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

import pyarrow as pa
from rocksdict import Options, Rdict, WriteBatch

from federator.catalog.definition import StoreDefinition
from federator.query.position import MergedPositions, Position, PositionBound
from federator.query.queries import Query
from federator.store.record import ChangelogRecord
from federator.store.layer import UNBOUNDED, LocalKeyQuery, ShardClosed, StoredEntry, StoreLayer, UnsupportedQuery, answer
from federator.store.types import StoreType
from federator.store.view import ShardView, any_scanned

log = logging.getLogger(__name__)

T = TypeVar("T")
A = TypeVar("A")
_entry = tuple.__new__  # a StoredEntry without NamedTuple's Python-level __new__ (one per point lookup)

META_CF = "federator_meta"
_POSITION = b"position"
_DEFINITION = b"definition"
_SOURCE = b"source"  # the broker's id of the changelog topic the data came from

__all__ = ["Shard", "ShardView", "ShardClosed", "TogetherReads", "UnsupportedQuery", "read_together"]


def _options() -> Options:
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    return opts


class Shard(StoreLayer):
    """A store partition: open, apply changelog batches, answer queries (the RocksDB layer)."""

    def __init__(self, path: str | Path, definition: StoreDefinition, partition: int) -> None:
        self.path = Path(path)
        self.definition = definition
        self.partition = partition
        self.topic = definition.topic
        self.store_type: StoreType = definition.store_type  # type: ignore[assignment]  # resolved by the registry
        self.schema = definition.arrow_schema()
        self._lock = threading.Lock()  # serializes writers
        # A sequence lock lets readers run without blocking writers: odd while a write is in
        # flight; a read that saw the same even number before and after saw one consistent
        # state, the one ``_position`` names. (rocksdict snapshots do not cover iterators.)
        self._seq = 0
        self._kept: dict[str, tuple[int, Any]] = {}  # name -> (seq, what a handler derived then)
        self._memory: Any = None  # what the store type keeps of this shard in memory (StoreType.memory)
        self._read_view: tuple[int, ShardView | None]  # (seq, the view the reads at it share)
        self._closed = False
        self._open()

    def _open(self) -> None:
        self._read_view = (-1, None)  # a view of the database before
        self.path.mkdir(parents=True, exist_ok=True)
        extra = self.store_type.column_families
        self.db = Rdict(str(self.path), _options(),
                        column_families={META_CF: Options(raw_mode=True), **{cf: Options(raw_mode=True) for cf in extra}})
        self._meta_handle = self.db.get_column_family_handle(META_CF)
        self._families = {
            cf: (self.db.get_column_family(cf), self.db.get_column_family_handle(cf)) for cf in extra
        }
        meta = self.db.get_column_family(META_CF)
        stored_defn = meta.get(_DEFINITION)
        raw_pos = meta.get(_POSITION)
        if stored_defn is not None and stored_defn != self.definition.to_json():
            # The store was redefined (new topic, formats or layout): what is on disk means nothing now.
            self._meta_handle = None
            self._families = {}
            del meta
            self.db.close()
            self._wipe_and_open()
            return
        self._position = Position.from_dict(json.loads(raw_pos)) if raw_pos else Position()
        raw_source = meta.get(_SOURCE)
        self._source = raw_source.decode() if raw_source else None
        if stored_defn is None:
            meta[_DEFINITION] = self.definition.to_json()
        self._memory = self.store_type.memory(self._view())

    def _wipe_and_open(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        self._open()

    def _view(self) -> ShardView:
        return ShardView(self.definition, self.schema, self.partition, self.db, self._families, self.kept,
                         self._memory, self._position)

    def _view_to_read(self) -> ShardView:
        """A view for a read: the one made at this write sequence, shared by the reads at it
        until a scan uses it (a scan's bounds live as long as its view), else a new one."""
        seq, view = self._read_view
        now = self._seq
        if seq != now or view is None or view.memory is not self._memory or view.scanned:
            view = self._view()
            if not now & 1 and self._seq == now:  # made with no write before or during it
                self._read_view = (now, view)
        return view

    def kept(self, name: str, build: Callable[[], T]) -> T:
        """``build()``, a handler's derivation of this shard's data (the leaderboard's sorted
        scores), kept under ``name`` until the next write. Exact inside ``consistent``'s read:
        a value kept at the sequence that read started at describes what it reads, and a
        write during the read makes ``consistent`` read again."""
        seq = self._seq
        hit = self._kept.get(name)
        if hit is not None and hit[0] == seq and not seq & 1:
            return hit[1]
        value = build()
        if not seq & 1 and self._seq == seq:  # no write before or during the build
            self._kept[name] = (seq, value)
        return value

    # ---- writing -------------------------------------------------------------------------
    @property
    def position(self) -> Position:
        return self._position

    @property
    def offset(self) -> int | None:
        """Offset of the last changelog record applied, None before the first."""
        return self._position.get(self.topic, self.partition)

    def stored_before(self, records: Sequence[ChangelogRecord]) -> Sequence[bytes | None] | None:
        """What the records' keys hold now, before they are applied (the store type's
        ``stored_before``); for the shard's writer, which nothing else writes under."""
        return self.store_type.stored_before(self._view(), records)

    def apply(self, records: Sequence[ChangelogRecord], through: int | None = None) -> tuple[int, int]:
        """Apply records (in offset order) and move the position past them, in one atomic write;
        ``through``: the changelog was read up to that offset, so the position moves there even
        where no record is data (a transactional producer's commit markers take offsets too).
        Returns the write sequence before and after it: a layer that keeps a read of the shard
        (the scan cache) follows the write when its read was at ``before``."""
        last = max(records[-1].offset if records else -1, -1 if through is None else through)
        if last <= (-1 if self.offset is None else self.offset):
            return self._seq, self._seq
        wb = WriteBatch(raw_mode=True)
        with self._lock:
            commit = self.store_type.apply(wb, records, self._view()) if records else None
            position = self._position.with_offset(self.topic, self.partition, last)
            wb.put(_POSITION, json.dumps(position.to_dict()).encode(), self._meta_handle)
            before = self._seq
            self._seq += 1
            try:
                self.db.write(wb)
                self._position = position
                if commit is not None:
                    self._commit(commit)
            finally:
                self._seq += 1
            return before, self._seq

    def _commit(self, commit: Callable[[], None]) -> None:
        """Bring the store type's memory to the batch just written; should that fail, build it
        again from what is written, so it never disagrees with the shard's position."""
        try:
            commit()
        except Exception:
            log.exception("store %r partition %s: rebuilding its in-memory state after a failed update",
                          self.definition.name, self.partition)
            self._memory = None
            self._memory = self.store_type.memory(self._view())
            raise

    @property
    def source(self) -> str | None:
        """The id of the changelog topic this shard was built from (None before it knows)."""
        return self._source

    def set_source(self, topic_id: str) -> bool:
        """Record the changelog's topic id; a different one than before empties the shard first.

        Returns True if the shard was emptied. A topic deleted and created again (or a broker
        restarted empty) gets a new id, and offsets of the old topic mean nothing in the new one.
        """
        if topic_id == self._source:
            return False
        wiped = self._source is not None or self.offset is not None
        self.reset(source=topic_id)
        return wiped

    def reset(self, source: str | None = None) -> None:
        """Drop all data and the position in one write: the changelog it came from is gone."""
        with self._lock:
            wb = WriteBatch(raw_mode=True)
            for db, handle in [(self.db, None), *self._families.values()]:
                it = db.iter()
                it.seek_to_last()
                if it.valid():
                    wb.delete_range(b"", it.key() + b"\x00", handle)
                del it
            wb.delete(_POSITION, self._meta_handle)
            if source is not None:
                wb.put(_SOURCE, source.encode(), self._meta_handle)
            self._seq += 1
            try:
                self.db.write(wb)
                self._position = Position()
                if source is not None:
                    self._source = source
                self._memory = None  # what the type builds of an empty shard
                self._memory = self.store_type.memory(self._view())
            finally:
                self._seq += 1

    def close(self) -> None:
        """Close the database; snapshots still held by readers keep it open until they go."""
        self._closed = True  # before the handles go: a reader that fails from here on says why
        with self._lock:
            self._meta_handle = None
            self._families = {}
            self._memory = None
            self._read_view = (-1, None)  # its column families would keep the database open
            self.db.close()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def base(self) -> Shard:
        return self

    # ---- reading -------------------------------------------------------------------------
    def consistent(self, read: Callable[[A], T], arg: A, tries: int = 3) -> tuple[T, Position, int]:
        """``read(arg)``, the Position it reflects exactly and the write sequence it was read
        at: the one optimistic read every read path goes through. ``read`` runs without holding
        writers off while no write is in flight before or during it (the sequence is the same
        even number after as before); after ``tries`` races with writes it runs once holding
        them off. A layer that keeps what it read (the scan cache) names it by the sequence,
        which ``read`` may read as ``seq``: it is the returned one whenever the read counts.
        Raises what ``read`` raises."""
        for _ in range(tries):
            seq = self._seq
            if seq & 1:
                time.sleep(0)  # a write is in flight; let it finish
                continue
            position = self._position
            value = read(arg)
            if self._seq == seq:
                return value, position, seq
        with self._lock:  # writes kept coming: read while holding them off
            return read(arg), self._position, self._seq

    @property
    def seq(self) -> int:
        """The write sequence: odd while a write is in flight (see ``consistent``)."""
        return self._seq

    def handler(self, query: Query) -> Callable[[ShardView, Query], pa.RecordBatch]:
        """The store type's handler for ``query``; UnsupportedQuery when it has none."""
        if self._closed:
            raise ShardClosed()
        handler = self.store_type.handler_for(query)
        if handler is None:
            raise UnsupportedQuery(
                f"store {self.definition.name!r} of type {self.definition.type!r} does not answer "
                f"{query.type_name}"
            )
        return handler

    def query(self, query: Query) -> tuple[pa.RecordBatch, Position]:
        """The answer and the Position it reflects exactly (raises for store problems)."""
        batch, position, _ = self.consistent(functools.partial(self.handler(query), self._view_to_read()), query)
        return batch, position

    def stored(self, key: bytes, bound: PositionBound) -> StoredEntry | None:
        """The stored bytes of ``key`` and the Position they reflect; None when the bound is not
        met or the shard failed (logged: a closed shard at debug level, as a rebalance closes
        shards under readers; anything else as a warning)."""
        if self._closed:
            return None
        try:
            stored, position, _ = self.consistent(self.db.get, key)
        except Exception:  # noqa: BLE001 - the caller takes the general path, whose errors say why
            if self._closed:
                log.debug("store %r partition %s closed under a key read", self.definition.name, self.partition)
            else:
                log.warning("store %r partition %s: key read failed", self.definition.name, self.partition,
                            exc_info=True)
            return None
        if not bound.is_satisfied_by(position, self.topic, self.partition):
            return None
        return _entry(StoredEntry, (stored, position))

    def run(self, query: Query, bound: PositionBound = UNBOUNDED, collect_execution_info: bool = False) -> Any:
        """Answer ``query`` as a per-partition IQv2 result (never raises for store problems); a
        LocalKeyQuery as a StoredEntry or None."""
        if type(query) is LocalKeyQuery:
            return self.stored(query.key_bytes, bound)
        return answer(self, query, bound, collect_execution_info, lambda: self.query(query))


class TogetherReads:
    """What a node keeps of its last read of one global store's shards together: the views and
    Positions read at the shards' write sequences, given again to a read of the same shards at
    the same ones while no scan has used a view (a rank asked between two writes makes none),
    and the merge of those Positions (``merged``)."""

    __slots__ = ("merged", "_last")

    def __init__(self) -> None:
        self.merged = MergedPositions()
        # (the shards, their write sequences, the views and Positions read at them); one tuple,
        # swapped whole: threads see parts that belong together
        self._last: tuple[Sequence[Shard] | None, list[int], list[ShardView], list[Position]] = (None, [], [], [])

    def at(self, shards: Sequence[Shard], seqs: list[int]) -> tuple[list[ShardView], list[Position]] | None:
        last, seen, views, positions = self._last
        if last is shards and seen == seqs and not any_scanned(views):
            return views, positions
        return None

    def keep(self, shards: Sequence[Shard], seqs: list[int], views: list[ShardView], positions: list[Position]) -> None:
        self._last = (shards, seqs, views, positions)


_SEQ = operator.attrgetter("_seq")


def read_together(shards: Sequence[Shard], read: Callable[[list[ShardView]], T], tries: int = 3,
                  kept: TogetherReads | None = None) -> tuple[T, list[Position]]:
    """``read`` over the views of several shards, each read in one state, and the Positions
    those states were: ``Shard.consistent`` for many. After ``tries`` races with writes it reads
    holding every shard's writers off (taken in the order given, as each writer holds one).
    ``kept``: the views of the last read of these shards, for a read at the same states."""
    for _ in range(tries):
        seqs = list(map(_SEQ, shards))  # in C, as below: a rank reads every partition, thousands of times a second
        at = None if kept is None else kept.at(shards, seqs)
        fresh = at is None
        if fresh:
            if any(q & 1 for q in seqs):
                time.sleep(0)  # a write is in flight; let it finish
                continue
            at = [s._view_to_read() for s in shards], [s._position for s in shards]
        value = read(at[0])
        if list(map(_SEQ, shards)) == seqs:
            if fresh and kept is not None:
                kept.keep(shards, seqs, *at)
            return value, at[1]
    with contextlib.ExitStack() as held:
        for s in shards:
            held.enter_context(s._lock)
        return read([s._view() for s in shards]), [s._position for s in shards]
