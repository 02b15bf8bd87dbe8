"""Arrow batches from raw shard entries, always against the store's declared schema."""

from __future__ import annotations

import struct
from typing import Sequence

import pyarrow as pa

from federator.catalog.definition import StoreDefinition
from federator.formats import TIMESTAMP, JsonFormat


def rowtimes(stored: Sequence[bytes]) -> pa.Array:
    joined = b"".join([v[:8] for v in stored])
    return pa.array(struct.unpack(f">{len(stored)}q", joined), TIMESTAMP)


def value_columns(defn: StoreDefinition, stored: Sequence[bytes]) -> list[pa.Array]:
    fmt = defn.value
    raw = [v[8:] for v in stored]
    if isinstance(fmt, JsonFormat):
        return fmt.decode_columns(raw)
    return [fmt.decode_many(raw)]


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
    cols: list[pa.Array] = [defn.key.decode_many(keys)]
    if window_starts is not None:
        cols.append(times(window_starts))
        cols.append(times(window_ends or []))
    cols.extend(value_columns(defn, stored))
    cols.append(rowtimes(stored))
    return pa.RecordBatch.from_arrays(cols, schema=schema)


def empty_batch(schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=schema)
