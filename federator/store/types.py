"""Store types: how a changelog record is applied, the Arrow schema, and which queries are answered.

Built-in types are kv, window, session and versioned (federator.store.kv, .window, .session,
.versioned). Which name stands for which type is the registry's business: the built-in plugin registers those,
plugins add more (federator.plugin). A store type's behaviour is asked of the type object,
never inferred from its name.
"""

from __future__ import annotations

import copy as _copy
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterable, Sequence

import pyarrow as pa
from rocksdict import WriteBatch

from federator.formats import TIMESTAMP
from federator.query.queries import Query, RangeQuery
from federator.store.layout import ROWTIME
from federator.store.record import ChangelogRecord

if TYPE_CHECKING:
    from federator.catalog.definition import StoreDefinition
    from federator.query.rows import Rows
    from federator.store.view import ShardView

Handler = Callable[["ShardView", Query], pa.RecordBatch]
# A query a global store answers from every partition's view at once (each a state it held),
# on the node asked: one step where a partition at a time would take rounds. Its answer never
# leaves the node, so a few rows may stay Python values (Rows) until a format needs Arrow.
TogetherHandler = Callable[[list["ShardView"], Query], "pa.RecordBatch | Rows"]
# Whether a together query's answer now is the one it gave when each partition was at the
# offset given: what lets a statement's kept answer follow writes that do not reach it.
TogetherFollower = Callable[[list["ShardView"], Query, list[int]], bool]


def stored_value(record: ChangelogRecord) -> bytes:
    """What a shard keeps per key: the record timestamp (8 bytes) then the value bytes."""
    return ROWTIME.pack(record.timestamp) + record.value  # type: ignore[operator]


class StoreType:
    """Base class. Subclasses set ``name`` and map query classes to handlers."""

    name: ClassVar[str]
    handlers: ClassVar[dict[type[Query], Handler]] = {}
    # Queries a global store answers over all its partitions at once (TogetherHandler).
    together_handlers: ClassVar[dict[type[Query], TogetherHandler]] = {}
    # For some of those, whether their answer stayed the same across writes (TogetherFollower).
    together_followers: ClassVar[dict[type[Query], TogetherFollower]] = {}
    # How writers lay out changelog records: "kv", "window" or "session" (federator.store.layout).
    changelog_layout: ClassVar[str] = "kv"
    # Extra RocksDB column families in each shard (say, an index), written in the same
    # atomic batch as the data and the position, and emptied with them.
    column_families: ClassVar[tuple[str, ...]] = ()
    # Rows carry window_start and window_end (window and session stores).
    windowed: ClassVar[bool] = False
    # A definition of this type must give window_size_ms (fixed-size windows); no other may.
    window_sized: ClassVar[bool] = False

    def schema(self, defn: StoreDefinition) -> pa.Schema:
        raise NotImplementedError

    def validate(self, defn: StoreDefinition) -> None:
        """Raise DefinitionError when ``defn`` does not suit this store type."""

    def memory(self, shard: ShardView) -> Any:
        """What this type keeps of a shard in memory beside RocksDB (say, an order-statistics
        index), built from the shard's data when it opens and when it is emptied, and read by
        handlers as ``view.memory``; None (the default): nothing."""
        return None

    def apply(self, wb: WriteBatch, records: Iterable[ChangelogRecord], shard: ShardView) -> Callable[[], None] | None:
        """Add a batch of changelog records to ``wb``; the shard writes it with the new position.
        A type that keeps ``memory`` returns the change to it: the shard runs it once ``wb`` is
        written, inside the same write (no read sees the one without the other)."""
        for r in records:
            if r.value is None:
                wb.delete(r.key)
            else:
                wb.put(r.key, stored_value(r))
        return None

    def is_full_scan(self, query: Query) -> bool:
        """Whether ``query`` reads the whole shard in key order (its answer may come from the scan cache)."""
        return False

    def full_scan_query(self) -> Query:
        """The query that reads every row: what the planner sends when no key narrows a read."""
        return RangeQuery()

    def follow_scan(self, defn: StoreDefinition, schema: pa.Schema, scan: pa.RecordBatch,
                    records: Sequence[ChangelogRecord]) -> pa.RecordBatch | None:
        """The full scan after ``records`` were applied to a shard whose full scan was ``scan``,
        or None to have the shard read again (the default)."""
        return None

    def stored_before(self, view: ShardView, records: Sequence[ChangelogRecord]) -> list[bytes | None] | None:
        """What each record's key holds in the shard before ``records`` are applied (None where
        it holds nothing), for the rows a write replaces; None (the default): this type does not
        tell, and results kept over its scans are made again after a write."""
        return None

    def stored_rows(self, defn: StoreDefinition, schema: pa.Schema, keys: Sequence[bytes],
                    stored: Sequence[bytes]) -> pa.RecordBatch:
        """The rows, in the full scan's schema, of the given keys holding ``stored`` (as
        ``stored_before`` returns it and ``apply`` writes it). Needed with ``stored_before``."""
        raise NotImplementedError

    def decode_row(self, defn: StoreDefinition, key: bytes, stored: bytes) -> tuple | None:
        """One stored entry (its key's bytes and what the shard keeps for it) as Python values in
        the schema's order, timestamps as epoch milliseconds: what the in-process point lookup
        answers with, building no Arrow for one row. None: this type's entries do not decode
        one at a time, and point lookups take the general path."""
        decode = self.row_decoder(defn)
        return None if decode is None else decode(key, stored)

    def row_decoder(self, defn: StoreDefinition, columns: Sequence[str] | None = None
                    ) -> Callable[[bytes, bytes], tuple] | None:
        """``decode_row`` for one definition, made once (the point plan keeps it), giving only
        ``columns`` (schema names, in that order; None: all). None (the default): entries do
        not decode one at a time. A type that returns one owns its layout; a subclass that
        changes the layout overrides it again."""
        return None

    def handler_for(self, query: Query) -> Handler | None:
        return self.handlers.get(type(query))

    def answers(self, *query_classes: type[Query]) -> bool:
        """Whether this type has a handler for every one of ``query_classes`` (what planning asks)."""
        return all(q in self.handlers for q in query_classes)

    def with_handlers(self, extra: dict[type[Query], Handler]) -> StoreType:
        """A copy of this store type that also answers ``extra`` (queries a plugin adds to a type
        it does not own); the original, and every other registry's copy, is left as it was."""
        copy = _copy.copy(self)
        copy.handlers = {**self.handlers, **extra}  # type: ignore[misc]  # per instance, on purpose
        return copy


def rowtime_field() -> pa.Field:
    return pa.field("rowtime", TIMESTAMP)
