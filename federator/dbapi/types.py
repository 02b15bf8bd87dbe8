"""PEP 249 type objects and constructors, result descriptions, and parameter conversion.

A column's ``type_code`` in ``Cursor.description`` is the service's SQL type name
(DuckDB's spelling, as in DESCRIBE and information_schema: ``VARCHAR``, ``BIGINT``,
``TIMESTAMP WITH TIME ZONE``, ...). Each type object compares equal to the names of its
group, so ``description[i][1] == NUMBER`` works as PEP 249 describes.
"""

from __future__ import annotations

import datetime as dt
import decimal
import time
import uuid
from typing import Any, Sequence

import pyarrow as pa

from federator.dbapi.errors import NotSupportedError, ProgrammingError
from federator.sql.types import sql_type_name


class DBAPITypeObject:
    def __init__(self, name: str, *prefixes: str) -> None:
        self.name = name
        self._prefixes = prefixes  # DECIMAL(10,2), TIMESTAMP WITH TIME ZONE: match by prefix

    def __eq__(self, other: object) -> bool:
        if isinstance(other, DBAPITypeObject):
            return other is self
        if isinstance(other, str):
            upper = other.upper()
            return any(upper == p or upper.startswith(p + "(") or upper.startswith(p + " ") for p in self._prefixes)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return f"<DBAPITypeObject {self.name}>"


STRING = DBAPITypeObject("STRING", "VARCHAR", "TEXT", "STRING", "CHAR")
NUMBER = DBAPITypeObject("NUMBER", "TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT",
                         "UINTEGER", "UBIGINT", "FLOAT", "DOUBLE", "REAL", "DECIMAL", "NUMERIC")
DATETIME = DBAPITypeObject("DATETIME", "TIMESTAMP", "TIMESTAMPTZ", "DATE", "TIME", "INTERVAL")
BINARY = DBAPITypeObject("BINARY", "BLOB", "BYTEA", "VARBINARY")
ROWID = DBAPITypeObject("ROWID")  # stores have no row ids; their key column is a plain typed column
BOOLEAN = DBAPITypeObject("BOOLEAN", "BOOLEAN", "BOOL")  # not in PEP 249, but handy beside the others

Date = dt.date
Time = dt.time
Timestamp = dt.datetime
Binary = bytes


def DateFromTicks(ticks: float) -> dt.date:  # noqa: N802 - PEP 249 names
    return Date(*time.localtime(ticks)[:3])


def TimeFromTicks(ticks: float) -> dt.time:  # noqa: N802
    return Time(*time.localtime(ticks)[3:6])


def TimestampFromTicks(ticks: float) -> dt.datetime:  # noqa: N802
    return Timestamp(*time.localtime(ticks)[:6])


Description = tuple[str, str, None, None, int | None, int | None, bool]


def describe(schema: pa.Schema) -> list[Description]:
    """PEP 249's 7-tuples (name, type_code, display_size, internal_size, precision, scale, null_ok)."""
    out: list[Description] = []
    for f in schema:
        precision = scale = None
        if pa.types.is_decimal(f.type):
            precision, scale = f.type.precision, f.type.scale
        out.append((f.name, sql_type_name(f.type), None, None, precision, scale, f.nullable))
    return out


def to_parameter(value: Any, index: int) -> Any:
    """A Python value as the JSON value the service binds to a ``?`` placeholder.

    The service binds strings, numbers, booleans and null. Dates and times go as ISO-8601
    text, which the service compares with timestamp columns as DuckDB does (a naive
    datetime is read as UTC, the service's zone).
    """
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, dt.datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, (dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        # No decimal type on the service's side: integral values stay exact.
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        raise NotSupportedError(f"parameter {index} is binary; the service binds strings, numbers, booleans "
                                "and NULL (compare BLOB columns in SQL instead)")
    # numpy scalars and the like: their item() is a plain Python value
    item = getattr(value, "item", None)
    if callable(item):
        plain = item()
        if plain is not value and not hasattr(plain, "item"):
            return to_parameter(plain, index)
    raise ProgrammingError(f"parameter {index} is a {type(value).__name__}; "
                           "parameters are str, int, float, bool, None, date/time, Decimal or UUID")


def to_parameters(params: Sequence[Any] | None) -> list[Any]:
    if params is None:
        return []
    if isinstance(params, (str, bytes)) or not isinstance(params, Sequence):
        # qmark takes a sequence; a dict (named style) or a bare string is a caller's mistake
        raise ProgrammingError(f"parameters must be a sequence (list or tuple) for the ? placeholders, "
                               f"not {type(params).__name__}")
    return [to_parameter(v, i) for i, v in enumerate(params, start=1)]
