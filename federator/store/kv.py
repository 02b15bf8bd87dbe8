"""Key-value stores: KeyQuery and RangeQuery."""

from __future__ import annotations

import bisect
from typing import Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from federator.catalog.definition import StoreDefinition
from federator.partitioner import partition_for
from federator.query.queries import KeyQuery, KeysQuery, RangeQuery
from federator.store.arrow import build_batch, empty_batch
from federator.store.shard import ShardView
from federator.store.record import ChangelogRecord
from federator.store.types import StoreType, register_store_type, rowtime_field, stored_value


def key_query(view: ShardView, q: KeyQuery) -> pa.RecordBatch:
    kb = view.definition.key.serialize(q.key)
    stored = view.get(kb)
    if stored is None:
        return empty_batch(view.schema)
    return build_batch(view.schema, view.definition, [kb], [stored])


def keys_query(view: ShardView, q: KeysQuery) -> pa.RecordBatch:
    """A multi-get of the keys that live in this partition, in the order given."""
    defn = view.definition
    keys, stored = [], []
    for k in q.keys:
        kb = defn.key.serialize(k)
        if partition_for(kb, defn.partitions) != view.partition:
            continue
        v = view.get(kb)
        if v is not None:
            keys.append(kb)
            stored.append(v)
    if not keys:
        return empty_batch(view.schema)
    return build_batch(view.schema, defn, keys, stored)


def range_query(view: ShardView, q: RangeQuery) -> pa.RecordBatch:
    keys: list[bytes] = []
    stored: list[bytes] = []
    ranges = view.definition.key.byte_ranges(q.lower, q.upper, q.lower_inclusive, q.upper_inclusive)
    if q.descending:
        ranges = [r.__class__(r.start, r.stop, not r.reverse) for r in reversed(ranges)]
    add_key, add_value = keys.append, stored.append
    for r in ranges:
        for k, v in view.scan(r.start, r.stop, r.reverse):
            add_key(k)
            add_value(v)
    return build_batch(view.schema, view.definition, keys, stored)


_EVERYTHING = RangeQuery()
# Key formats whose Arrow sort order is the order of a full scan: byte order for strings and
# bytes (Arrow compares them bytewise, as RocksDB does), value order for integers (their
# byte ranges are scanned negatives first). Doubles are left out: -0.0 and 0.0 sort apart in
# a scan but equal in Arrow.
_FOLLOWABLE_KEYS = ("string", "bytes", "long", "int")


class KeyValueStoreType(StoreType):
    name = "kv"
    handlers = {KeyQuery: key_query, KeysQuery: keys_query, RangeQuery: range_query}

    def is_full_scan(self, query) -> bool:
        return type(query) is RangeQuery and query == _EVERYTHING

    def schema(self, defn: StoreDefinition) -> pa.Schema:
        return pa.schema([pa.field(defn.key_name, defn.key.arrow_type), *defn.value_arrow_fields(), rowtime_field()])

    def follow_scan(self, defn: StoreDefinition, schema: pa.Schema, scan: pa.RecordBatch,
                    records: Sequence[ChangelogRecord]) -> pa.RecordBatch | None:
        """The written keys' rows replaced in place when they all exist already (the common
        update), else dropped, the live ones added and the batch sorted by key again."""
        if defn.key.name not in _FOLLOWABLE_KEYS:
            return None
        last = {r.key: r for r in records}  # in offset order: the last record of a key wins
        written = defn.key.decode_many(list(last))
        hit = pc.is_in(scan.column(0), value_set=written)
        live = [r for r in last.values() if r.value is not None]
        if live and pc.sum(hit).as_py() == len(last):  # every written key is in the scan: no new rows
            return self._replace_in_place(defn, schema, scan, hit, dict(zip(written.to_pylist(), last.values())))
        kept = scan.filter(pc.invert(hit))
        if not live:
            return kept
        added = build_batch(schema, defn, [r.key for r in live], [stored_value(r) for r in live])
        table = pa.Table.from_batches([kept, added]).sort_by([(schema.names[0], "ascending")])
        return table.combine_chunks().to_batches()[0]

    def changed_rows(self, defn: StoreDefinition, schema: pa.Schema, scan: pa.RecordBatch,
                     records: Sequence[ChangelogRecord],
                     earlier: Callable[[bytes], ChangelogRecord | None]) -> tuple[pa.Table, pa.Table] | None:
        """Each written key's row before ``records`` (from its latest earlier record, else the
        scan) is removed; its row after them, unless deleted, is added."""
        if defn.key.name not in _FOLLOWABLE_KEYS:
            return None
        last = {r.key: r for r in records}
        before = {k: r for k in last if (r := earlier(k)) is not None}
        old = [r for r in before.values() if r.value is not None]
        from_scan = [k for k in last if k not in before]
        removed = [scan.take(_rows_of(scan.column(0), defn.key.decode_many(from_scan)))] if from_scan else []
        if old:
            removed.append(build_batch(schema, defn, [r.key for r in old], [stored_value(r) for r in old]))
        new = [r for r in last.values() if r.value is not None]
        added = [build_batch(schema, defn, [r.key for r in new], [stored_value(r) for r in new])] if new else []
        return pa.Table.from_batches(removed, schema), pa.Table.from_batches(added, schema)

    @staticmethod
    def _replace_in_place(defn: StoreDefinition, schema: pa.Schema, scan: pa.RecordBatch, hit: pa.Array,
                          by_key: dict[object, ChangelogRecord]) -> pa.RecordBatch:
        rows = [by_key[k] for k in scan.column(0).filter(hit).to_pylist()]  # the hit rows, in scan order
        live = [r for r in rows if r.value is not None]
        deleted = [r.key for r in rows if r.value is None]
        gone = pc.is_in(scan.column(0), value_set=defn.key.decode_many(deleted)) if deleted else None
        if gone is not None:
            hit = pc.and_(hit, pc.invert(gone))  # replaced: the live rows only
        new = build_batch(schema, defn, [r.key for r in live], [stored_value(r) for r in live])
        scan = pa.RecordBatch.from_arrays(
            [pc.replace_with_mask(col, hit, new.column(i)) for i, col in enumerate(scan.columns)], schema=scan.schema)
        return scan if gone is None else scan.filter(pc.invert(gone))


# Up to this many keys are looked up by bisection (a few probes each, in Python); more by one
# vectorized pass over the whole key column.
_BISECT_KEYS = 32


class _AsPython:
    """A key column seen as a sequence of Python values, for bisect."""

    def __init__(self, column: pa.Array) -> None:
        self.column = column

    def __len__(self) -> int:
        return len(self.column)

    def __getitem__(self, i: int) -> object:
        return self.column[i].as_py()


def _rows_of(column: pa.Array, keys: pa.Array) -> pa.Array:
    """Indices of ``keys`` present in ``column`` (a scan: sorted, unique keys)."""
    if len(keys) > _BISECT_KEYS:
        return pc.indices_nonzero(pc.is_in(column, value_set=keys))
    seq, found = _AsPython(column), []
    for k in keys.to_pylist():
        i = bisect.bisect_left(seq, k)
        if i < len(seq) and seq[i] == k:
            found.append(i)
    return pa.array(sorted(found), pa.int64())


register_store_type(KeyValueStoreType())
