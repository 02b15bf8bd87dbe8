"""Catalog queries BI tools send over the Postgres protocol, as their sources write them.

Each entry: (tool, where in the tool's source the query is built, the SQL, its parameters, what
the answer must show). ``%s`` marks a parameter as psycopg sends it (DBeaver's prepared ``?``).
"""

from __future__ import annotations

from typing import Any, Callable

_GRAFANA_SCHEMAS = """quote_ident(table_schema) IN (
  SELECT
    CASE WHEN trim(s[i]) = '"$user"' THEN user ELSE trim(s[i]) END
  FROM
    generate_series(
      array_lower(string_to_array(current_setting('search_path'),','),1),
      array_upper(string_to_array(current_setting('search_path'),','),1)
    ) as i,
    string_to_array(current_setting('search_path'),',') s
)"""

Check = Callable[[list[tuple]], bool]


def _has(*values: Any) -> Check:
    return lambda rows: all(any(v in row for row in rows) for v in values)


QUERIES: list[tuple[str, str, str, tuple, Check]] = [
    ("Grafana", "postgres datasource, postgresMetaQuery.ts buildTableQuery",
     "SELECT quote_ident(table_name) FROM information_schema.tables WHERE " + _GRAFANA_SCHEMAS + " ORDER BY table_name",
     (), lambda rows: rows == [("blobs",), ("per_minute",), ("players",)]),
    ("Grafana", "postgres datasource, postgresMetaQuery.ts buildColumnQuery (time columns)",
     "SELECT quote_ident(column_name) FROM information_schema.columns WHERE " + _GRAFANA_SCHEMAS
     + " AND table_name = 'players' AND data_type IN ('timestamp without time zone','timestamp with time zone',"
       "'bigint','integer','double precision','real') ORDER BY column_name",
     (), lambda rows: ("last_seen",) in rows),
    ("Grafana", "postgres datasource, version detection",
     "SELECT current_setting('server_version_num')::int/100 as version", (), lambda rows: rows == [(1600,)]),
    ("DBeaver", "PostgreDatabase.java, schemas",
     "SELECT n.oid,n.*,d.description FROM pg_catalog.pg_namespace n\n"
     "LEFT OUTER JOIN pg_catalog.pg_description d ON d.objoid=n.oid AND d.objsubid=0 AND "
     "d.classoid='pg_namespace'::regclass\n ORDER BY nspname", (), _has("main")),
    ("DBeaver", "PostgreDatabase.java, the database",
     "SELECT db.oid,db.* FROM pg_catalog.pg_database db WHERE datname=%s", ("federator",), _has("federator")),
    ("DBeaver", "PostgreSchema.java, tables of a schema",
     "SELECT c.oid,c.*,d.description,pg_catalog.pg_get_expr(c.relpartbound, c.oid) as partition_expr,  "
     "pg_catalog.pg_get_partkeydef(c.oid) as partition_key \nFROM pg_catalog.pg_class c\n"
     "LEFT OUTER JOIN pg_catalog.pg_description d ON d.objoid=c.oid AND d.objsubid=0 AND d.classoid='pg_class'::regclass\n"
     "WHERE c.relnamespace=(SELECT oid FROM pg_catalog.pg_namespace WHERE nspname = 'main') "
     "AND c.relkind not in ('i','I','c')", (), _has("players", "blobs", "per_minute")),
    ("DBeaver", "PostgreDataSource.java, on connect", "SELECT current_schema(),session_user", (),
     lambda rows: rows == [("main", "tester")]),
    ("DBeaver", "on connect", "SHOW search_path", (), lambda rows: rows == [("main",)]),
    ("Metabase", "postgres driver, on connect (through pgjdbc)", "SHOW TIMEZONE", (), lambda rows: rows == [("UTC",)]),
]
