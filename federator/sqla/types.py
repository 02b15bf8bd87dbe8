"""Federator's SQL type names (DuckDB's spelling, see federator.sql.types) and SQLAlchemy's types."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any, Callable

from sqlalchemy import types as sqltypes
from sqlalchemy.sql import compiler

# SQLAlchemy 1.4 has no Double; Float with asdecimal=False is the same thing there.
_Double = getattr(sqltypes, "Double", sqltypes.Float)


class FederatorDateTime(sqltypes.DateTime):
    """Literal timestamps the service parses (``literal_binds``, as Superset compiles filters)."""

    def literal_processor(self, dialect: Any) -> Callable[[Any], str]:
        def process(value: Any) -> str:
            if isinstance(value, dt.datetime):
                return f"TIMESTAMP '{value.isoformat(sep=' ')}'"
            return f"TIMESTAMP '{value}'"

        return process


class FederatorDate(sqltypes.Date):
    def literal_processor(self, dialect: Any) -> Callable[[Any], str]:
        return lambda value: f"DATE '{value.isoformat() if isinstance(value, dt.date) else value}'"


# Exact names as the service reports them (information_schema.columns.data_type).
ISCHEMA_NAMES: dict[str, Any] = {
    "VARCHAR": sqltypes.String,
    "TEXT": sqltypes.String,
    "BOOLEAN": sqltypes.Boolean,
    "TINYINT": sqltypes.SmallInteger,
    "SMALLINT": sqltypes.SmallInteger,
    "INTEGER": sqltypes.Integer,
    "BIGINT": sqltypes.BigInteger,
    "UTINYINT": sqltypes.SmallInteger,
    "USMALLINT": sqltypes.Integer,
    "UINTEGER": sqltypes.BigInteger,
    "UBIGINT": sqltypes.BigInteger,
    "FLOAT": sqltypes.Float,
    "DOUBLE": _Double,
    "BLOB": sqltypes.LargeBinary,
    "TIMESTAMP": sqltypes.DateTime,
    "TIMESTAMP WITH TIME ZONE": lambda: sqltypes.DateTime(timezone=True),
    "DATE": sqltypes.Date,
    "TIME": sqltypes.Time,
    "INTERVAL": sqltypes.Interval,
}

_DECIMAL = re.compile(r"DECIMAL\((\d+),\s*(\d+)\)")


def resolve_type(name: str) -> sqltypes.TypeEngine:
    """The SQLAlchemy type for a service type name; NullType for what has no counterpart
    (lists, structs, maps), so reflection still lists the column."""
    upper = name.strip().upper()
    factory = ISCHEMA_NAMES.get(upper)
    if factory is not None:
        return factory()
    m = _DECIMAL.fullmatch(upper)
    if m:
        return sqltypes.Numeric(int(m.group(1)), int(m.group(2)))
    return sqltypes.NullType()


class FederatorTypeCompiler(compiler.GenericTypeCompiler):
    """Type names in CAST as the service accepts them (INTEGER, BIGINT, DOUBLE, VARCHAR,
    BOOLEAN, TIMESTAMP, TIMESTAMP WITH TIME ZONE, DATE)."""

    def visit_FLOAT(self, type_: Any, **kw: Any) -> str:
        return "DOUBLE"

    visit_REAL = visit_DOUBLE = visit_DOUBLE_PRECISION = visit_NUMERIC = visit_DECIMAL = visit_FLOAT

    def visit_VARCHAR(self, type_: Any, **kw: Any) -> str:
        return "VARCHAR"  # no length: the stores' strings have none

    visit_NVARCHAR = visit_CHAR = visit_NCHAR = visit_TEXT = visit_CLOB = visit_VARCHAR

    def visit_SMALLINT(self, type_: Any, **kw: Any) -> str:
        return "INTEGER"

    def visit_BLOB(self, type_: Any, **kw: Any) -> str:
        return "BLOB"

    visit_BINARY = visit_VARBINARY = visit_BLOB

    def visit_TIMESTAMP(self, type_: Any, **kw: Any) -> str:
        return "TIMESTAMP WITH TIME ZONE" if getattr(type_, "timezone", False) else "TIMESTAMP"

    visit_DATETIME = visit_TIMESTAMP
