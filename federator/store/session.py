"""Session stores: SessionQuery (one key) and WindowRangeQuery (all keys).

Entries are kept under their changelog key (key + session end + session start).
"""

from __future__ import annotations

import pyarrow as pa

from federator.catalog.definition import StoreDefinition
from federator.query.queries import SessionQuery, WindowRangeQuery
from federator.store.arrow import build_batch, empty_batch
from federator.store.layout import MAX_TIME, SESSION_SUFFIX_LEN, split_session_key, time_bytes
from federator.store.shard import ShardView
from federator.store.types import StoreType, register_store_type
from federator.store.window import windowed_schema


def _overlaps(start: int, end: int, lo: int | None, hi: int | None) -> bool:
    return (lo is None or end >= lo) and (hi is None or start <= hi)


def session_query(view: ShardView, q: SessionQuery) -> pa.RecordBatch:
    kb = view.definition.key.serialize(q.key)
    if q.time_to is not None and q.time_to < 0:
        return empty_batch(view.schema)  # session times are non-negative epoch ms
    # Sessions of kb are ordered by end: start the scan at the earliest end that can overlap.
    start = kb + time_bytes(max(q.time_from or 0, 0))
    stop = kb + time_bytes(MAX_TIME) + b"\xff" * 8 + b"\x00"
    want = len(kb) + SESSION_SUFFIX_LEN
    keys, starts, ends, stored = [], [], [], []
    for k, v in view.scan(start, stop):
        if len(k) != want:
            continue
        _, s, e = split_session_key(k)
        if _overlaps(s, e, q.time_from, q.time_to):
            keys.append(kb)
            starts.append(s)
            ends.append(e)
            stored.append(v)
    return build_batch(view.schema, view.definition, keys, stored, starts, ends)


def session_range_query(view: ShardView, q: WindowRangeQuery) -> pa.RecordBatch:
    keys, starts, ends, stored = [], [], [], []
    for k, v in view.scan():
        kb, s, e = split_session_key(k)
        if _overlaps(s, e, q.time_from, q.time_to):
            keys.append(kb)
            starts.append(s)
            ends.append(e)
            stored.append(v)
    return build_batch(view.schema, view.definition, keys, stored, starts, ends)


class SessionStoreType(StoreType):
    name = "session"
    handlers = {SessionQuery: session_query, WindowRangeQuery: session_range_query}

    def schema(self, defn: StoreDefinition) -> pa.Schema:
        return windowed_schema(defn)


register_store_type(SessionStoreType())
