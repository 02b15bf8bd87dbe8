"""Session stores: SessionQuery (one key) and WindowRangeQuery (all keys).

Entries are kept under their changelog key (key + session end + session start).
"""

from __future__ import annotations

import pyarrow as pa

from federator.catalog.definition import StoreDefinition
from federator.query.queries import Query, SessionQuery, WindowRangeQuery
from federator.store.arrow import build_batch, chunked, join_chunks
from federator.query.rows import empty_batch
from federator.store.layout import MAX_TIME, SESSION_SUFFIX_LEN, split_session_key, time_bytes
from federator.store.view import ShardView
from federator.store.types import StoreType
from federator.store.window import windowed_schema


def _overlaps(start: int, end: int, lo: int | None, hi: int | None) -> bool:
    return (lo is None or end >= lo) and (hi is None or start <= hi)


def _sessions(view: ShardView, entries, q, key_len: int | None = None) -> pa.RecordBatch:
    """Sessions among ``entries`` that overlap q's times (of keys ``key_len`` long, if given)."""
    parts = []
    for chunk in chunked(entries):  # a chunk's Python objects at a time (see scan_batch)
        keys, starts, ends, stored = [], [], [], []
        for k, v in chunk:
            if key_len is not None and len(k) != key_len + SESSION_SUFFIX_LEN:
                continue  # a longer key that shares the prefix
            kb, s, e = split_session_key(k)
            if _overlaps(s, e, q.time_from, q.time_to):
                keys.append(kb)
                starts.append(s)
                ends.append(e)
                stored.append(v)
        if keys:
            parts.append(build_batch(view.schema, view.definition, keys, stored, starts, ends))
    return join_chunks(parts) if parts else build_batch(view.schema, view.definition, [], [], [], [])


def session_query(view: ShardView, q: SessionQuery) -> pa.RecordBatch:
    kb = view.definition.key.serialize(q.key)
    if q.time_to is not None and q.time_to < 0:
        return empty_batch(view.schema)  # session times are non-negative epoch ms
    # Sessions of kb are ordered by end: start the scan at the earliest end that can overlap.
    start = kb + time_bytes(max(q.time_from or 0, 0))
    stop = kb + time_bytes(MAX_TIME) + b"\xff" * 8 + b"\x00"
    return _sessions(view, view.scan(start, stop), q, len(kb))


def session_range_query(view: ShardView, q: WindowRangeQuery) -> pa.RecordBatch:
    return _sessions(view, view.scan(fill_cache=False), q)  # every entry: a bulk read


class SessionStoreType(StoreType):
    name = "session"
    changelog_layout = "session"
    windowed = True
    handlers = {SessionQuery: session_query, WindowRangeQuery: session_range_query}

    def is_full_scan(self, query) -> bool:
        return type(query) is WindowRangeQuery and query.time_from is None and query.time_to is None

    def full_scan_query(self) -> Query:
        return WindowRangeQuery()

    def schema(self, defn: StoreDefinition) -> pa.Schema:
        return windowed_schema(defn)
