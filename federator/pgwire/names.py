"""Which relations of a Postgres statement are stores and which the catalog answers.

A store is read from the store whatever its name's form: bare, ``schema.store`` (``public``,
Postgres's default, or ``main``, DuckDB's), ``database.schema.store``, quoted or not. Only
relations of ``pg_catalog`` and ``information_schema`` (a bare ``pg_…`` name is in
``pg_catalog``, on Postgres's implicit search path) are the catalog's. Any other name is taken
for a store, so that the engine answers it or says that there is no such store: the catalog's
tables of the stores are empty, and must never stand in for one.
"""

from __future__ import annotations

from sqlglot import exp

from federator.catalog.definition import StoreDefinition
from federator.sql.catalog_tables import CATALOG, unqualify_store_columns

CATALOG_SCHEMAS = {"pg_catalog", "information_schema"}


def relations(tree: exp.Expression, stores: dict[str, StoreDefinition],
              catalog_schemas: set[str] = CATALOG_SCHEMAS) -> tuple[list[exp.Table], list[exp.Table]]:
    """(the relations of ``tree`` that name stores, or unknown names; those the catalog answers),
    each in the order written. ``catalog_schemas``: the schemas whose relations are the catalog's
    (with the catalog's own schema of fixed views once the statement is rewritten)."""
    names = {n.lower() for n in stores}
    ctes = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    schemas = {s.lower() for s in catalog_schemas}
    found: tuple[list[exp.Table], list[exp.Table]] = ([], [])
    for table in tree.find_all(exp.Table, bfs=False):
        kind = _kind(table, names, ctes, schemas)
        if kind is not None:
            found[kind].append(table)
    return found


_STORE, _CATALOG = 0, 1


def _kind(table: exp.Table, stores: set[str], ctes: set[str], catalog_schemas: set[str]) -> int | None:
    """_STORE, _CATALOG or None (a table function, a WITH query)."""
    if not isinstance(table.this, exp.Identifier):
        return None  # a table function: generate_series(...), unnest(...)
    name, db, catalog = table.name.lower(), (table.db or "").lower(), (table.catalog or "").lower()
    if not db and not catalog and name in ctes:
        return None  # a WITH query's name hides a store's, as in Postgres
    if catalog not in ("", CATALOG):
        return _STORE  # another database: the engine says there is none
    if db in catalog_schemas or (not db and name not in stores and name.startswith("pg_")):
        return _CATALOG
    return _STORE


def calls_functions_of(tree: exp.Expression, schema: str) -> bool:
    """Whether ``tree`` calls a function of ``schema`` (``schema.f(...)``)."""
    return any(isinstance(n, exp.Dot) and isinstance(n.this, exp.Identifier) and n.this.name.lower() == schema
               for n in tree.walk())


def point_at(tree: exp.Expression, tables: list[exp.Table], relations: list[exp.Table]) -> None:
    """Each of ``tables`` (of ``tree``) made to read the matching one of ``relations``, under its
    own name or alias, so that the statement's column qualifiers still find it."""
    for table, relation in zip(tables, relations):
        alias = table.alias_or_name
        table.set("this", relation.this.copy())
        table.set("db", relation.args["db"].copy() if relation.args.get("db") else None)
        table.set("catalog", relation.args["catalog"].copy() if relation.args.get("catalog") else None)
        if not table.alias:
            table.set("alias", exp.TableAlias(this=exp.to_identifier(alias, quoted=True)))
    unqualify_store_columns(tree)
