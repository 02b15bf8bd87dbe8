"""Window stores (fixed-size windows): WindowKeyQuery and WindowRangeQuery.

Entries are kept under their changelog key (key + window start + seqnum), so the
windows of one key are contiguous and ordered by start.
"""

from __future__ import annotations

import pyarrow as pa

from federator.catalog.definition import StoreDefinition
from federator.formats import TIMESTAMP
from federator.query.queries import Query, WindowKeyQuery, WindowRangeQuery
from federator.store.arrow import build_batch, chunked, join_chunks
from federator.query.rows import empty_batch
from federator.store.layout import MAX_TIME, WINDOW_SUFFIX_LEN, split_window_key, time_bytes
from federator.store.view import ShardView
from federator.store.types import StoreType, rowtime_field


def windowed_schema(defn: StoreDefinition) -> pa.Schema:
    return pa.schema(
        [
            pa.field(defn.key_name, defn.key.arrow_type),
            pa.field("window_start", TIMESTAMP),
            pa.field("window_end", TIMESTAMP),
            *defn.value_arrow_fields(),
            rowtime_field(),
        ]
    )


def _in(t: int, lo: int | None, hi: int | None) -> bool:
    return (lo is None or t >= lo) and (hi is None or t <= hi)


def _windows(view: ShardView, entries, q, key_len: int | None = None) -> pa.RecordBatch:
    """Windows among ``entries`` whose start lies in q's times (of keys ``key_len`` long, if given)."""
    size = view.definition.window_size_ms or 0
    parts = []
    for chunk in chunked(entries):  # a chunk's Python objects at a time (see scan_batch)
        keys, starts, stored = [], [], []
        for k, v in chunk:
            if key_len is not None and len(k) != key_len + WINDOW_SUFFIX_LEN:
                continue  # a longer key that shares the prefix
            kb, ws, _ = split_window_key(k)
            if _in(ws, q.time_from, q.time_to):
                keys.append(kb)
                starts.append(ws)
                stored.append(v)
        if keys:
            parts.append(build_batch(view.schema, view.definition, keys, stored, starts, [s + size for s in starts]))
    return join_chunks(parts) if parts else build_batch(view.schema, view.definition, [], [], [], [])


def window_key_query(view: ShardView, q: WindowKeyQuery) -> pa.RecordBatch:
    kb = view.definition.key.serialize(q.key)
    if q.time_to is not None and (q.time_to < 0 or (q.time_from is not None and q.time_from > q.time_to)):
        return empty_batch(view.schema)  # window starts are non-negative epoch ms
    # Every entry between these bounds starts with kb; longer keys that share the prefix are skipped.
    start = kb + time_bytes(max(q.time_from or 0, 0))
    stop = kb + time_bytes(MAX_TIME if q.time_to is None else q.time_to) + b"\xff\xff\xff\xff\x00"
    return _windows(view, view.scan(start, stop), q, len(kb))


def window_range_query(view: ShardView, q: WindowRangeQuery) -> pa.RecordBatch:
    return _windows(view, view.scan(fill_cache=False), q)  # every entry: a bulk read


class WindowStoreType(StoreType):
    name = "window"
    changelog_layout = "window"
    windowed = True
    window_sized = True
    handlers = {WindowKeyQuery: window_key_query, WindowRangeQuery: window_range_query}

    def is_full_scan(self, query) -> bool:
        return type(query) is WindowRangeQuery and query.time_from is None and query.time_to is None

    def full_scan_query(self) -> Query:
        return WindowRangeQuery()

    def schema(self, defn: StoreDefinition) -> pa.Schema:
        return windowed_schema(defn)
