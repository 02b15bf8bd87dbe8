"""Tables Federator makes from its catalog: SHOW TABLES, DESCRIBE, information_schema."""

from __future__ import annotations

import pyarrow as pa
from sqlglot import exp

from federator.catalog.definition import StoreDefinition
from federator.sql.types import sql_type

# Where stores live, as information_schema and Flight SQL name it; BI tools qualify names with these.
CATALOG, SCHEMA = "federator", "main"
# The schema names a store is read under: DuckDB's default, and Postgres's (where Postgres tools look)
STORE_SCHEMAS = (SCHEMA, "public")


def names_store_schema(catalog: str | None, db: str | None) -> bool:
    """Whether a table qualified with ``catalog.db`` (either may be empty) is in the stores' schema."""
    return (catalog or CATALOG).lower() == CATALOG and (db or SCHEMA).lower() in STORE_SCHEMAS


def unqualify_store_columns(tree: exp.Expression) -> list[tuple[exp.Expression, exp.Expression]]:
    """Columns written ``schema.store.column`` or ``catalog.schema.store.column`` as ``store.column``:
    the relation a store is read into has no schema, only the store's name or alias. Returns,
    for each, its first qualifier taken off and its store's name (where they stood in the text
    tells what to take off the user's own text)."""
    taken = []
    for col in tree.find_all(exp.Column):
        if col.args.get("db") is not None and names_store_schema(col.catalog, col.db):
            taken.append((col.args.get("catalog") or col.args["db"], col.args["table"]))
            col.set("db", None)
            col.set("catalog", None)
    return taken


def show_tables(stores: dict[str, StoreDefinition]) -> pa.Table:
    return pa.table({"name": pa.array(sorted(stores), pa.string())})


def describe(defn: StoreDefinition) -> pa.Table:
    schema = defn.arrow_schema()
    return pa.table({
        "column_name": pa.array([f.name for f in schema], pa.string()),
        "column_type": pa.array([sql_type(f.type) for f in schema], pa.string()),
        "null": pa.array(["NO" if f.name == defn.key_name else "YES" for f in schema], pa.string()),
        "key": pa.array(["PRI" if f.name == defn.key_name else None for f in schema], pa.string()),
        "default": pa.array([None] * len(schema), pa.string()),
        "extra": pa.array([None] * len(schema), pa.string()),
    })


def information_schema(name: str, stores: dict[str, StoreDefinition]) -> pa.Table | None:
    if name == "tables":
        names = sorted(stores)
        return pa.table({
            "table_catalog": pa.array([CATALOG] * len(names), pa.string()),
            "table_schema": pa.array([SCHEMA] * len(names), pa.string()),
            "table_name": pa.array(names, pa.string()),
            "table_type": pa.array(["BASE TABLE"] * len(names), pa.string()),
            "store_type": pa.array([stores[n].type for n in names], pa.string()),
            "partitions": pa.array([stores[n].partitions for n in names], pa.int64()),
            "scope": pa.array([stores[n].scope for n in names], pa.string()),  # global or partitioned
        })
    if name == "columns":
        rows: dict[str, list] = {k: [] for k in ("table_catalog", "table_schema", "table_name", "column_name",
                                                 "ordinal_position", "data_type", "is_nullable")}
        for n in sorted(stores):
            defn = stores[n]
            for i, f in enumerate(defn.arrow_schema(), start=1):
                rows["table_catalog"].append(CATALOG)
                rows["table_schema"].append(SCHEMA)
                rows["table_name"].append(n)
                rows["column_name"].append(f.name)
                rows["ordinal_position"].append(i)
                rows["data_type"].append(sql_type(f.type))
                rows["is_nullable"].append("NO" if f.name == defn.key_name else "YES")
        return pa.table({k: pa.array(v, pa.int64() if k == "ordinal_position" else pa.string()) for k, v in rows.items()})
    return None
