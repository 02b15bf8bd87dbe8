"""Arrow batches from raw shard entries, always against the store's declared schema.

A stored value is the record's 8-byte big-endian rowtime followed by the value bytes. Many
entries are split and decoded with numpy over one Arrow binary array (a full scan spent more
time slicing and unpacking bytes in Python than reading RocksDB); a few are decoded in Python,
which costs less than setting up the arrays.

A scan is built ``SCAN_CHUNK_ROWS`` entries at a time (``scan_batch``): the Python bytes that
RocksDB's iterator hands out, in their lists, take three to four times their Arrow size, so
holding a whole partition's at once made the first read of a shard the node's peak memory.
The chunks are joined into one batch at the end, column by column.
"""

from __future__ import annotations

import bisect
import struct
from itertools import islice
from typing import Any, Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa

from federator.catalog.definition import StoreDefinition
from federator.formats import TIMESTAMP, FormatError, JsonFormat, binary_buffers
from federator.store.layout import ROWTIME_LEN

_VECTOR_MIN = 64  # entries from which the numpy path is cheaper
SCAN_CHUNK_ROWS = 16_384  # entries whose Python bytes a scan holds at once (see scan_batch)
_ROWTIME = ROWTIME_LEN


def rowtimes(stored: Sequence[bytes]) -> pa.Array:
    joined = b"".join([v[:8] for v in stored])
    return pa.array(struct.unpack(f">{len(stored)}q", joined), TIMESTAMP)


def value_columns(defn: StoreDefinition, stored: Sequence[bytes]) -> list[pa.Array]:
    fmt = defn.value
    raw = [v[8:] for v in stored]
    if isinstance(fmt, JsonFormat):
        return fmt.decode_columns(raw)
    return [fmt.decode_many(raw)]


def split_stored(stored: pa.Array) -> tuple[pa.Array, pa.Array]:
    """(rowtimes, value bytes) of a binary array of stored values."""
    offsets, data = binary_buffers(stored)
    n = len(stored)
    lengths = offsets[1:] - offsets[:-1]
    if n and lengths.min() < _ROWTIME:
        raise FormatError(f"a stored value has {int(lengths.min())} bytes, fewer than its {_ROWTIME}-byte rowtime")
    value_offsets = offsets - offsets[0] - _ROWTIME * np.arange(n + 1, dtype=np.int32)
    if n and (lengths == lengths[0]).all():
        # every entry the same size (fixed-width values): one reshape, no index arrays
        rows = data[offsets[0]:offsets[-1]].reshape(n, int(lengths[0]))
        times = np.ascontiguousarray(rows[:, :_ROWTIME])
        values = np.ascontiguousarray(rows[:, _ROWTIME:]).ravel()
    else:
        prefix = (offsets[:-1, None] + np.arange(_ROWTIME, dtype=np.int32)).ravel()
        times = data[prefix]
        values = np.delete(data[:offsets[-1]], prefix)[offsets[0]:]
    stamps = pa.array(times.view(">i8").ravel().astype(np.int64), pa.int64()).cast(TIMESTAMP)
    value_bytes = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(value_offsets), pa.py_buffer(values)])
    return stamps, value_bytes


def times(values: Sequence[int]) -> pa.Array:
    return pa.array(values, TIMESTAMP)


def build_batch(
    schema: pa.Schema,
    defn: StoreDefinition,
    keys: Sequence[bytes],
    stored: Sequence[bytes],
    window_starts: Sequence[int] | None = None,
    window_ends: Sequence[int] | None = None,
) -> pa.RecordBatch:
    """Columns in schema order: key, [window_start, window_end], value columns..., rowtime."""
    vector = len(keys) >= _VECTOR_MIN
    cols: list[pa.Array] = [
        defn.key.decode_array(pa.array(keys, pa.binary())) if vector else defn.key.decode_many(keys)
    ]
    if window_starts is not None:
        cols.append(times(window_starts))
        cols.append(times(window_ends or []))
    if vector:
        stamps, value_bytes = split_stored(pa.array(stored, pa.binary()))
        fmt = defn.value
        if isinstance(fmt, JsonFormat):
            cols.extend(fmt.decode_columns(value_bytes.to_pylist()))
        else:
            cols.append(fmt.decode_array(value_bytes))
        cols.append(stamps)
    else:
        cols.extend(value_columns(defn, stored))
        cols.append(rowtimes(stored))
    return pa.RecordBatch.from_arrays(cols, schema=schema)


def scan_batch(schema: pa.Schema, defn: StoreDefinition, entries: Iterable[tuple[bytes, bytes]],
               chunk_rows: int | None = None) -> pa.RecordBatch:
    """``build_batch`` over (key, stored value) entries as an iterator yields them, in their
    order: built ``chunk_rows`` (default SCAN_CHUNK_ROWS) entries at a time, so only one
    chunk's Python bytes exist at once, and the chunks joined into one batch."""
    chunk_rows = chunk_rows or SCAN_CHUNK_ROWS
    it = iter(entries)
    chunks: list[pa.RecordBatch] = []
    full = True
    while full:
        keys: list[bytes] = []
        stored: list[bytes] = []
        add_key, add_value = keys.append, stored.append
        for k, v in islice(it, chunk_rows):
            add_key(k)
            add_value(v)
        full = len(keys) == chunk_rows
        if keys or not chunks:
            chunks.append(build_batch(schema, defn, keys, stored))
        del keys, stored, add_key, add_value  # before the next chunk's, and before the join
    return join_chunks(chunks)


def chunked(entries: Iterable, rows: int | None = None) -> Iterator[list]:
    """``entries`` in lists of ``rows`` (default SCAN_CHUNK_ROWS; the last one shorter), for
    scans that filter or split each entry before ``build_batch``."""
    rows = rows or SCAN_CHUNK_ROWS
    it = iter(entries)
    while chunk := list(islice(it, rows)):
        yield chunk
        if len(chunk) < rows:
            return


def join_chunks(chunks: list[pa.RecordBatch]) -> pa.RecordBatch:
    """One batch of ``chunks`` (at least one, all of one schema), their rows in order.

    Empties ``chunks``, and joins column by column, dropping each column's pieces once it is
    joined: the pieces and the joined batch are not all held at once."""
    if len(chunks) == 1:
        return chunks.pop()
    schema = chunks[0].schema
    columns: list[list[pa.Array] | None] = [[c.column(i) for c in chunks] for i in range(len(schema))]
    chunks.clear()
    joined = []
    for i, pieces in enumerate(columns):
        columns[i] = None
        joined.append(pa.concat_arrays(pieces))
        del pieces
    return pa.RecordBatch.from_arrays(joined, schema=schema)


class _Values:
    """An Arrow array's values as Python values, read only where bisect compares."""

    __slots__ = ("array",)

    def __init__(self, array: pa.Array) -> None:
        self.array = array

    def __len__(self) -> int:
        return len(self.array)

    def __getitem__(self, i: int) -> object:
        return self.array[i].as_py()


class _Bytes:
    """A string or binary array's values as bytes, sliced from its buffers: a tenth of the cost
    of an Arrow scalar per comparison. UTF-8's byte order is the order of the code points,
    Python's order of the same strings."""

    __slots__ = ("offsets", "data", "n")

    def __init__(self, array: pa.Array) -> None:
        _, offsets, data = array.buffers()
        width = 8 if pa.types.is_large_string(array.type) or pa.types.is_large_binary(array.type) else 4
        self.n = len(array)
        self.offsets = np.frombuffer(offsets, dtype=np.int64 if width == 8 else np.int32, count=self.n + 1,
                                     offset=array.offset * width)
        self.data = memoryview(data) if data is not None else memoryview(b"")

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> bytes:
        return self.data[self.offsets[i]:self.offsets[i + 1]].tobytes()


def search_sorted(needles: pa.Array, ordered: pa.Array) -> pa.Array:
    """For each of ``needles``, its row in ``ordered`` (ascending, unique; null: absent), by
    binary search: cheaper than hashing ``ordered`` for a few needles. A full scan's key order
    is bytes order for strings and bytes and value order for integers, which is Python's and
    numpy's order of the same values (not so for doubles: -0.0 and 0.0)."""
    kind = ordered.type
    if ordered.null_count == 0 and needles.null_count == 0 and pa.types.is_integer(kind) and needles.type == kind:
        hay, want = ordered.to_numpy(zero_copy_only=True), needles.to_numpy(zero_copy_only=True)
        at = np.searchsorted(hay, want)
        hit = at < len(hay)
        hit[hit] = hay[at[hit]] == want[hit]
        return pa.array(at, pa.int64(), mask=~hit)
    if ordered.null_count == 0 and (pa.types.is_string(kind) or pa.types.is_large_string(kind) or
                                    pa.types.is_binary(kind) or pa.types.is_large_binary(kind)):
        values: Any = _Bytes(ordered)
        text = pa.types.is_string(kind) or pa.types.is_large_string(kind)
        wanted = [k.encode() if text and k is not None else k for k in needles.to_pylist()]
    else:
        values, wanted = _Values(ordered), needles.to_pylist()
    found = []
    for key in wanted:
        i = len(values) if key is None else bisect.bisect_left(values, key)
        found.append(i if i < len(values) and values[i] == key else None)
    return pa.array(found, pa.int64())
