"""SQL names of Arrow types, DuckDB's spelling: one place for DESCRIBE, information_schema,
the columns of a SQL answer, and error messages."""

from __future__ import annotations

from typing import Callable

import pyarrow as pa


def sql_type_name(t: pa.DataType) -> str:
    """A readable SQL name for an Arrow type (DuckDB's spelling where there is a choice)."""
    if pa.types.is_dictionary(t):
        return sql_type_name(t.value_type)
    if isinstance(t, pa.ExtensionType):
        return sql_type_name(t.storage_type)
    for test, name in _TYPE_NAMES:
        if test(t):
            return name
    if pa.types.is_decimal(t):
        return f"DECIMAL({t.precision},{t.scale})"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t) or _is(t, "is_list_view"):
        return f"{sql_type_name(t.value_type)}[]"
    if pa.types.is_struct(t):
        return "STRUCT(" + ", ".join(f"{f.name} {sql_type_name(f.type)}" for f in t) + ")"
    if pa.types.is_map(t):
        return f"MAP({sql_type_name(t.key_type)}, {sql_type_name(t.item_type)})"
    return str(t).upper()


def _is(t: pa.DataType, predicate: str) -> bool:
    # Newer Arrow types (views) are missing from older pyarrow; treat them as absent there.
    fn = getattr(pa.types, predicate, None)
    return bool(fn and fn(t))


_TYPE_NAMES: list[tuple[Callable[[pa.DataType], bool], str]] = [
    (pa.types.is_boolean, "BOOLEAN"),
    (pa.types.is_int8, "TINYINT"),
    (pa.types.is_int16, "SMALLINT"),
    (pa.types.is_int32, "INTEGER"),
    (pa.types.is_int64, "BIGINT"),
    (pa.types.is_uint8, "UTINYINT"),
    (pa.types.is_uint16, "USMALLINT"),
    (pa.types.is_uint32, "UINTEGER"),
    (pa.types.is_uint64, "UBIGINT"),
    (pa.types.is_float16, "FLOAT"),
    (pa.types.is_float32, "FLOAT"),
    (pa.types.is_float64, "DOUBLE"),
    (lambda t: pa.types.is_string(t) or pa.types.is_large_string(t) or _is(t, "is_string_view"), "VARCHAR"),
    (lambda t: pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t)
     or _is(t, "is_binary_view"), "BLOB"),
    (lambda t: pa.types.is_timestamp(t) and t.tz is not None, "TIMESTAMP WITH TIME ZONE"),
    (pa.types.is_timestamp, "TIMESTAMP"),
    (pa.types.is_date, "DATE"),
    (pa.types.is_time, "TIME"),
    (lambda t: pa.types.is_duration(t) or pa.types.is_interval(t), "INTERVAL"),
    (pa.types.is_null, "NULL"),
]


sql_type = sql_type_name
