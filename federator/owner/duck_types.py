"""DuckDB's types that Arrow's own types lose, and how they travel between DuckDB databases.

Arrow has no 128-bit integer: DuckDB exports HUGEINT and UHUGEINT (a SUM of integers is a
HUGEINT) as decimal128(38, 0), which DuckDB reads back as DECIMAL(38,0), another type: integer
division turns into float division and hex(), <<, gcd() refuse it. So the owners' partial
states travel as decimal128(38, 0), as DuckDB exports them (the Arrow finish and the followed
states read them as exact decimals), and the receiver hands such a column to its DuckDB as
DuckDB's own Arrow type for it (what DuckDB exports with ``arrow_lossless_conversion``): the
same 16 bytes a value, read as a HUGEINT. The answer a client gets is DuckDB's ordinary
export, as when the receiver computes the SUM itself.
"""

from __future__ import annotations

import functools

import pyarrow as pa

# DuckDB's type name -> the Arrow extension type DuckDB reads as that type
LOSSLESS: dict[str, pa.DataType] = {
    name: pa.opaque(pa.binary(16), type_name=name.lower(), vendor_name="DuckDB") for name in ("HUGEINT", "UHUGEINT")}
# what DuckDB's default Arrow export makes of each (the type the values travel as)
_WIRE = pa.decimal128(38, 0)


def typed_schema(schema: pa.Schema, duckdb_types: list[str]) -> pa.Schema:
    """``schema`` (DuckDB's default export of an answer whose columns have ``duckdb_types``)
    with each column of a type that export loses as DuckDB's Arrow type for it."""
    if not any(t in LOSSLESS for t in duckdb_types):
        return schema
    return pa.schema([f.with_type(LOSSLESS[t]) if t in LOSSLESS else f for f, t in zip(schema, duckdb_types)],
                     metadata=schema.metadata)


@functools.lru_cache(maxsize=1024)
def wire_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` as DuckDB's default Arrow export gives it (what owners send, what a client
    gets): the lossless types of ``typed_schema`` as decimal128(38, 0)."""
    if not any(_lossless(f.type) for f in schema):
        return schema
    return pa.schema([f.with_type(_WIRE) if _lossless(f.type) else f for f in schema], metadata=schema.metadata)


def as_typed(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` (in ``wire_schema(schema)``'s types) with its columns of ``schema``'s
    lossless types viewed as those: the same buffers, no copy (decimal128 and DuckDB's
    HUGEINT are both 16 little-endian bytes of two's complement a value)."""
    if not any(_lossless(f.type) for f in schema):
        return table
    columns = []
    for field, column in zip(schema, table.columns):
        if _lossless(field.type) and not _lossless(column.type):
            column = pa.chunked_array([pa.ExtensionArray.from_storage(field.type, c.view(field.type.storage_type))
                                       for c in column.chunks], field.type)
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=schema)


def _lossless(t: pa.DataType) -> bool:
    return isinstance(t, pa.BaseExtensionType) and t in _TYPES


_TYPES = set(LOSSLESS.values())
