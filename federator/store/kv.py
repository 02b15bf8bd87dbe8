"""Key-value stores: KeyQuery and RangeQuery."""

from __future__ import annotations

import pyarrow as pa

from federator.catalog.definition import StoreDefinition
from federator.partitioner import partition_for
from federator.query.queries import KeyQuery, KeysQuery, RangeQuery
from federator.store.arrow import build_batch, empty_batch
from federator.store.shard import ShardView
from federator.store.types import StoreType, register_store_type, rowtime_field


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


class KeyValueStoreType(StoreType):
    name = "kv"
    handlers = {KeyQuery: key_query, KeysQuery: keys_query, RangeQuery: range_query}

    def is_full_scan(self, query) -> bool:
        return type(query) is RangeQuery and query == _EVERYTHING

    def schema(self, defn: StoreDefinition) -> pa.Schema:
        return pa.schema([pa.field(defn.key_name, defn.key.arrow_type), *defn.value_arrow_fields(), rowtime_field()])


register_store_type(KeyValueStoreType())
