"""Flight SQL catalog results (GetCatalogs, GetDbSchemas, GetTables, GetTableTypes, GetSqlInfo).

The result schemas are the spec's, field for field and nullability for nullability: clients such
as the ADBC driver compare them with their reference schemas and refuse anything else.

Federator names its catalog ``federator`` and the stores' schema ``main``, as its
information_schema does; ``information_schema.tables`` and ``.columns`` are listed as system tables.
"""

from __future__ import annotations

import re
from typing import Any

import pyarrow as pa

from federator.catalog.definition import StoreDefinition
from federator.sql.catalog_tables import CATALOG, SCHEMA, information_schema
from federator.sql.types import sql_type

SYSTEM_SCHEMA = "information_schema"
TABLE = "TABLE"
SYSTEM_TABLE = "SYSTEM TABLE"
TABLE_TYPES = (SYSTEM_TABLE, TABLE)  # ordered, as GetTableTypes must be

CATALOGS_SCHEMA = pa.schema([pa.field("catalog_name", pa.utf8(), nullable=False)])
DB_SCHEMAS_SCHEMA = pa.schema([
    pa.field("catalog_name", pa.utf8()),
    pa.field("db_schema_name", pa.utf8(), nullable=False),
])
TABLES_SCHEMA = pa.schema([
    pa.field("catalog_name", pa.utf8()),
    pa.field("db_schema_name", pa.utf8()),
    pa.field("table_name", pa.utf8(), nullable=False),
    pa.field("table_type", pa.utf8(), nullable=False),
])
TABLES_WITH_SCHEMA_SCHEMA = TABLES_SCHEMA.append(pa.field("table_schema", pa.binary(), nullable=False))
TABLE_TYPES_SCHEMA = pa.schema([pa.field("table_type", pa.utf8(), nullable=False)])
PRIMARY_KEYS_SCHEMA = pa.schema([
    pa.field("catalog_name", pa.utf8()),
    pa.field("db_schema_name", pa.utf8()),
    pa.field("table_name", pa.utf8(), nullable=False),
    pa.field("column_name", pa.utf8(), nullable=False),
    pa.field("key_name", pa.utf8()),
    pa.field("key_sequence", pa.int32(), nullable=False),
])

# GetSqlInfo's value column: a dense union whose members are told apart by type code 0..5.
_INFO_MEMBERS = [
    pa.field("string_value", pa.utf8(), nullable=False),
    pa.field("bool_value", pa.bool_(), nullable=False),
    pa.field("bigint_value", pa.int64(), nullable=False),
    pa.field("int32_bitmask", pa.int32(), nullable=False),
    pa.field("string_list", pa.list_(pa.utf8()), nullable=False),
    pa.field("int32_to_int32_list_map", pa.map_(pa.int32(), pa.list_(pa.int32())), nullable=False),
]
_INFO_UNION = pa.dense_union(_INFO_MEMBERS, type_codes=list(range(len(_INFO_MEMBERS))))
SQL_INFO_SCHEMA = pa.schema([
    pa.field("info_name", pa.uint32(), nullable=False),
    pa.field("value", _INFO_UNION, nullable=False),
])
STRING, BOOL, BIGINT, INT32, STRING_LIST = 0, 1, 2, 3, 4


def sql_info_values() -> dict[int, tuple[int, Any]]:
    """SqlInfo id -> (union member, value). Ids from FlightSql.proto's SqlInfo enum."""
    from federator import __version__

    return {
        0: (STRING, "Federator"),  # FLIGHT_SQL_SERVER_NAME
        1: (STRING, __version__),  # FLIGHT_SQL_SERVER_VERSION
        2: (STRING, pa.__version__),  # FLIGHT_SQL_SERVER_ARROW_VERSION
        3: (BOOL, True),  # FLIGHT_SQL_SERVER_READ_ONLY
        4: (BOOL, True),  # FLIGHT_SQL_SERVER_SQL
        5: (BOOL, False),  # FLIGHT_SQL_SERVER_SUBSTRAIT
        8: (INT32, 0),  # FLIGHT_SQL_SERVER_TRANSACTION: SQL_SUPPORTED_TRANSACTION_NONE
        9: (BOOL, False),  # FLIGHT_SQL_SERVER_CANCEL
        500: (BOOL, False),  # SQL_DDL_CATALOG
        501: (BOOL, False),  # SQL_DDL_SCHEMA
        502: (BOOL, False),  # SQL_DDL_TABLE
        503: (INT32, 1),  # SQL_IDENTIFIER_CASE: case-insensitive (store names match either way)
        504: (STRING, '"'),  # SQL_IDENTIFIER_QUOTE_CHAR
        505: (INT32, 1),  # SQL_QUOTED_IDENTIFIER_CASE
        507: (INT32, 3),  # SQL_NULL_ORDERING: at the end, as DuckDB sorts
        509: (STRING_LIST, ["ABS", "ROUND"]),  # SQL_NUMERIC_FUNCTIONS
        510: (STRING_LIST, ["LENGTH", "LOWER", "SUBSTR", "UPPER"]),  # SQL_STRING_FUNCTIONS
        513: (STRING, "\\"),  # SQL_SEARCH_STRING_ESCAPE: for the catalog filter patterns below
        515: (BOOL, True),  # SQL_SUPPORTS_COLUMN_ALIASING
        516: (BOOL, True),  # SQL_NULL_PLUS_NULL_IS_NULL
    }


def sql_info(requested: list[int]) -> pa.Table:
    """One row per requested id this server knows (all of them when none are requested)."""
    values = sql_info_values()
    ids = [i for i in requested if i in values] if requested else sorted(values)
    types = [values[i][0] for i in ids]
    children: list[list[Any]] = [[] for _ in _INFO_MEMBERS]
    offsets = []
    for i in ids:
        member, value = values[i]
        offsets.append(len(children[member]))
        children[member].append(value)
    arrays = [pa.array(vals, f.type) for vals, f in zip(children, _INFO_MEMBERS)]
    # from_buffers keeps the declared (non-nullable) member fields; UnionArray.from_dense would not.
    value = pa.Array.from_buffers(
        _INFO_UNION, len(ids),
        [None, pa.array(types, pa.int8()).buffers()[1], pa.array(offsets, pa.int32()).buffers()[1]],
        children=arrays,
    )
    return pa.Table.from_arrays([pa.array(ids, pa.uint32()), value], schema=SQL_INFO_SCHEMA)


def like_regex(pattern: str | None) -> re.Pattern[str] | None:
    """A Flight SQL filter pattern (% any run, _ one character, backslash escapes) as a regex."""
    if pattern is None:
        return None
    out, escaped = [], False
    for ch in pattern:
        if escaped:
            out.append(re.escape(ch))
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == "%":
            out.append(".*")
        elif ch == "_":
            out.append(".")
        else:
            out.append(re.escape(ch))
    return re.compile("".join(out), re.DOTALL)


def _matches(regex: re.Pattern[str] | None, value: str) -> bool:
    return regex is None or regex.fullmatch(value) is not None


def _catalog_ok(catalog: str | None) -> bool:
    # An empty string asks for objects without a catalog: Federator has none of those.
    return catalog is None or catalog == CATALOG


def catalogs() -> pa.Table:
    return pa.Table.from_pylist([{"catalog_name": CATALOG}], schema=CATALOGS_SCHEMA)


def db_schemas(catalog: str | None, schema_pattern: str | None) -> pa.Table:
    regex = like_regex(schema_pattern)
    rows = [{"catalog_name": CATALOG, "db_schema_name": s} for s in sorted((SCHEMA, SYSTEM_SCHEMA))
            if _catalog_ok(catalog) and _matches(regex, s)]
    return pa.Table.from_pylist(rows, schema=DB_SCHEMAS_SCHEMA)


def _with_column_metadata(schema: pa.Schema, schema_name: str, table: str) -> pa.Schema:
    """Field metadata the spec defines for table schemas (JDBC/ODBC drivers show TYPE_NAME)."""
    fields = []
    for f in schema:
        fields.append(f.with_metadata({
            "ARROW:FLIGHT:SQL:CATALOG_NAME": CATALOG,
            "ARROW:FLIGHT:SQL:DB_SCHEMA_NAME": schema_name,
            "ARROW:FLIGHT:SQL:TABLE_NAME": table,
            "ARROW:FLIGHT:SQL:TYPE_NAME": sql_type(f.type),
            "ARROW:FLIGHT:SQL:IS_READ_ONLY": "1",
            "ARROW:FLIGHT:SQL:IS_SEARCHABLE": "1",
            "ARROW:FLIGHT:SQL:IS_AUTO_INCREMENT": "0",
            "ARROW:FLIGHT:SQL:IS_CASE_SENSITIVE": "1" if pa.types.is_string(f.type) else "0",
        }))
    return pa.schema(fields)


def _all_tables(stores: dict[str, StoreDefinition]) -> list[tuple[str, str, str, pa.Schema]]:
    """(schema, table, type, Arrow schema) for every table a query can name, in the spec's order."""
    out = []
    for name in ("columns", "tables"):
        virtual = information_schema(name, stores)
        if virtual is not None:
            out.append((SYSTEM_SCHEMA, name, SYSTEM_TABLE, virtual.schema))
    for name, defn in sorted(stores.items()):
        out.append((SCHEMA, name, TABLE, defn.arrow_schema()))
    return sorted(out, key=lambda t: (t[0], t[1], t[2]))


def tables(stores: dict[str, StoreDefinition], catalog: str | None, schema_pattern: str | None,
           table_pattern: str | None, table_types: list[str], include_schema: bool) -> pa.Table:
    schema_re, table_re = like_regex(schema_pattern), like_regex(table_pattern)
    wanted = set(table_types)
    rows = []
    for schema_name, table, ttype, arrow_schema in _all_tables(stores) if _catalog_ok(catalog) else []:
        if not (_matches(schema_re, schema_name) and _matches(table_re, table)) or (wanted and ttype not in wanted):
            continue
        row: dict[str, Any] = {"catalog_name": CATALOG, "db_schema_name": schema_name,
                               "table_name": table, "table_type": ttype}
        if include_schema:
            row["table_schema"] = _with_column_metadata(arrow_schema, schema_name, table).serialize().to_pybytes()
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=TABLES_WITH_SCHEMA_SCHEMA if include_schema else TABLES_SCHEMA)


def table_types() -> pa.Table:
    return pa.Table.from_pylist([{"table_type": t} for t in TABLE_TYPES], schema=TABLE_TYPES_SCHEMA)


def primary_keys(stores: dict[str, StoreDefinition], catalog: str | None, schema: str | None, table: str) -> pa.Table:
    """A store's key column is its primary key (one row per store, none for system tables)."""
    defn = stores.get(table)
    rows = []
    if defn is not None and _catalog_ok(catalog) and schema in (None, SCHEMA):
        rows.append({"catalog_name": CATALOG, "db_schema_name": SCHEMA, "table_name": defn.name,
                     "column_name": defn.key_name, "key_name": None, "key_sequence": 1})
    return pa.Table.from_pylist(rows, schema=PRIMARY_KEYS_SCHEMA)
