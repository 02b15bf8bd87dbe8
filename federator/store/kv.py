"""Key-value stores: KeyQuery and RangeQuery."""

from __future__ import annotations

import operator
from itertools import chain
from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from federator.catalog.definition import StoreDefinition
from federator.partitioner import partition_for
from federator.query.queries import KeyQuery, KeysQuery, RangeQuery
from federator.store.layout import ROWTIME
from federator.store.arrow import build_batch, scan_batch, search_sorted
from federator.query.rows import empty_batch
from federator.store.view import ShardView
from federator.store.record import ChangelogRecord
from federator.store.types import StoreType, rowtime_field, stored_value


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

    def row_decoder(self, defn: StoreDefinition, columns: Sequence[str] | None = None) -> Callable[[bytes, bytes], tuple]:
        """Of (key, value column..., rowtime ms), ``columns``: the key as written, the stored
        value its 8-byte rowtime then the value bytes (``stored_value``). The formats'
        functions are bound once and nothing unselected is decoded: this runs once per point
        lookup."""
        key, value, unpack = defn.key.deserialize, defn.value.deserialize, ROWTIME.unpack_from
        key_name, fields = defn.key_name, bool(defn.value_fields)
        wanted = tuple(columns) if columns is not None else tuple(self.schema(defn).names)
        if fields and not {key_name, "rowtime"} & set(wanted):  # value columns only: the common SELECT
            if len(wanted) == 1:
                (name,) = wanted
                return lambda k, stored: (value(stored[8:])[name],)
            pick = operator.itemgetter(*wanted)
            return lambda k, stored: pick(value(stored[8:]))

        def decode(k: bytes, stored: bytes) -> tuple:
            v: Any = None
            out = []
            for c in wanted:
                if c == key_name:
                    out.append(key(k))
                elif c == "rowtime":
                    out.append(unpack(stored)[0])
                else:
                    if v is None:
                        v = value(stored[8:])
                    out.append(v[c] if fields else v)
            return tuple(out)

        return decode

    def follow_scan(self, defn: StoreDefinition, schema: pa.Schema, scan: pa.RecordBatch,
                    records: Sequence[ChangelogRecord]) -> pa.RecordBatch | None:
        """The written keys' rows replaced or dropped in place when they all exist already (the
        common update), else dropped, the live ones added and the batch sorted by key again."""
        if defn.key.name not in _FOLLOWABLE_KEYS:
            return None
        last = list({r.key: r for r in records}.values())  # in offset order: the last record of a key wins
        written = defn.key.decode_many([r.key for r in last])
        rows = _rows_of(scan.column(0), written)
        if (rows >= 0).all():
            return _in_place(defn, schema, scan, rows, last)
        kept = scan.filter(pc.invert(_bool_mask(len(scan), rows[rows >= 0])))
        live = [r for r in last if r.value is not None]
        if not live:
            return kept
        added = build_batch(schema, defn, [r.key for r in live], [stored_value(r) for r in live])
        table = pa.Table.from_batches([kept, added]).sort_by([(schema.names[0], "ascending")])
        return table.combine_chunks().to_batches()[0]

    def stored_before(self, view: ShardView, records: Sequence[ChangelogRecord]) -> list[bytes | None] | None:
        return [view.get(r.key) for r in records]

    def stored_rows(self, defn: StoreDefinition, schema: pa.Schema, keys: Sequence[bytes],
                    stored: Sequence[bytes]) -> pa.RecordBatch:
        return build_batch(schema, defn, list(keys), list(stored))


_BISECT_MAX = 256  # written keys up to which a binary search each beats hashing the whole scan


def _rows_of(keys: pa.Array, wanted: pa.Array) -> np.ndarray:
    """The row of each wanted key in ``keys`` (a full scan's: sorted, unique), -1 where absent."""
    found = pc.index_in(wanted, value_set=keys) if len(wanted) > _BISECT_MAX else search_sorted(wanted, keys)
    return found.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)


def _mask(n: int, rows: np.ndarray) -> np.ndarray:
    mask = np.zeros(n, np.bool_)
    mask[rows] = True
    return mask


def _in_place(defn: StoreDefinition, schema: pa.Schema, scan: pa.RecordBatch, rows: np.ndarray,
              last: list[ChangelogRecord]) -> pa.RecordBatch:
    """Every written key has a row: the live ones get their new values, the deleted ones go.
    The key column is the same values and is kept as it is (replacing strings copies them all)."""
    order = np.argsort(rows, kind="stable")
    live = [i for i in order if last[i].value is not None]
    gone = [rows[i] for i in order if last[i].value is None]
    columns = list(scan.columns)
    if live:
        new = build_batch(schema, defn, [last[i].key for i in live], [stored_value(last[i]) for i in live])
        replaced = _bool_mask(len(scan), rows[live])
        columns[1:] = [pc.replace_with_mask(col, replaced, new.column(i + 1)) for i, col in enumerate(columns[1:])]
    batch = pa.RecordBatch.from_arrays(columns, schema=scan.schema)
    if gone:
        batch = batch.filter(pc.invert(_bool_mask(len(scan), np.array(gone, np.int64))))
    return batch


def _bool_mask(n: int, rows: np.ndarray) -> pa.Array:
    """``_mask`` as an Arrow array, its bits packed by numpy: pa.array() of a numpy bool array
    costs a few times more than the replace it serves."""
    bits = np.packbits(_mask(n, rows), bitorder="little")
    return pa.Array.from_buffers(pa.bool_(), n, [None, pa.py_buffer(bits)])
