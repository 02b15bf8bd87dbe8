"""Key-value stores: KeyQuery and RangeQuery."""

from __future__ import annotations

from itertools import chain
from typing import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from federator.catalog.definition import StoreDefinition
from federator.partitioner import partition_for
from federator.query.queries import KeyQuery, KeysQuery, RangeQuery
from federator.store.arrow import build_batch, empty_batch, scan_batch
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
    ranges = view.definition.key.byte_ranges(q.lower, q.upper, q.lower_inclusive, q.upper_inclusive)
    if q.descending:
        ranges = [r.__class__(r.start, r.stop, not r.reverse) for r in reversed(ranges)]
    # A scan with neither bound reads every entry: a bulk read, kept out of RocksDB's block
    # cache (which would hold a copy of the whole shard afterwards; the scan cache keeps it).
    bulk = q.lower is None and q.upper is None
    entries = chain.from_iterable(view.scan(r.start, r.stop, r.reverse, fill_cache=not bulk) for r in ranges)
    return scan_batch(view.schema, view.definition, entries)


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


register_store_type(KeyValueStoreType())
