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
     "d.classoid='pg_namespace'::regclass\n ORDER BY nspname", (), _has("public")),
    ("DBeaver", "PostgreDatabase.java, the database",
     "SELECT db.oid,db.* FROM pg_catalog.pg_database db WHERE datname=%s", ("federator",), _has("federator")),
    ("DBeaver", "PostgreSchema.java, tables of a schema",
     "SELECT c.oid,c.*,d.description,pg_catalog.pg_get_expr(c.relpartbound, c.oid) as partition_expr,  "
     "pg_catalog.pg_get_partkeydef(c.oid) as partition_key \nFROM pg_catalog.pg_class c\n"
     "LEFT OUTER JOIN pg_catalog.pg_description d ON d.objoid=c.oid AND d.objsubid=0 AND d.classoid='pg_class'::regclass\n"
     "WHERE c.relnamespace=(SELECT oid FROM pg_catalog.pg_namespace WHERE nspname = 'public') "
     "AND c.relkind not in ('i','I','c')", (), _has("players", "blobs", "per_minute")),
    ("DBeaver", "PostgreDataSource.java, on connect", "SELECT current_schema(),session_user", (),
     lambda rows: rows == [("public", "tester")]),
    ("DBeaver", "on connect", "SHOW search_path", (), lambda rows: rows == [('"$user", public',)]),
    ("Metabase", "postgres driver, on connect (through pgjdbc)", "SHOW TIMEZONE", (), lambda rows: rows == [("UTC",)]),
    ("Superset", "PostgresEngineSpec.get_catalog_names",
     "SELECT datname FROM pg_database\nWHERE datistemplate = false;", (), lambda rows: rows == [("federator",)]),
    ("Superset", "PostgresEngineSpec.get_cancel_query_id", "SELECT pg_backend_pid()",
     (), lambda rows: len(rows) == 1 and isinstance(rows[0][0], int)),
]

# Data queries BI tools generate over the stores, as their sources write them: each tool qualifies
# the names in its own way. Each entry: (tool, where the tool builds it, the SQL). The answer must
# be DuckDB's over the same rows, the names unqualified (test_connect_postgres.py).
_DAY = ("TO_TIMESTAMP('2023-11-14 00:00:00.000000', 'YYYY-MM-DD HH24:MI:SS.US')",
        "TO_TIMESTAMP('2023-11-15 00:00:00.000000', 'YYYY-MM-DD HH24:MI:SS.US')")
_SUPERSET_GRAINS = ("second", "minute", "hour", "day", "week", "month", "quarter", "year")

DATA_QUERIES: list[tuple[str, str, str]] = [
    *(("Superset", f"time-series chart, PostgresEngineSpec time grain {grain!r}, convert_dttm for the day's bounds",
       f"SELECT DATE_TRUNC('{grain}', window_start) AS window_start, sum(points) AS \"SUM(points)\" \n"
       f"FROM main.per_minute \nWHERE window_start >= {_DAY[0]} AND window_start < {_DAY[1]} "
       f"GROUP BY DATE_TRUNC('{grain}', window_start) ORDER BY \"SUM(points)\" DESC \n LIMIT 10000")
      for grain in _SUPERSET_GRAINS),
    ("Superset", "SQL Lab, a query with its row limit applied", "SELECT * FROM main.per_minute\nLIMIT 1001"),
    ("Superset", "a chart over a virtual dataset (a subquery)",
     "SELECT team AS team, sum(points) AS \"SUM(points)\" \nFROM (SELECT p.team, m.points FROM players p "
     "JOIN per_minute m ON m.player = p.player) AS virtual_table GROUP BY team ORDER BY \"SUM(points)\" DESC \n"
     " LIMIT 10000"),
    ("Metabase", "postgres driver, a table's preview",
     "SELECT \"public\".\"players\".\"player\" AS \"player\", \"public\".\"players\".\"team\" AS \"team\", "
     "\"public\".\"players\".\"games\" AS \"games\", \"public\".\"players\".\"last_seen\" AS \"last_seen\" "
     "FROM \"public\".\"players\" LIMIT 2000"),
    ("Metabase", "postgres driver, count by a column",
     "SELECT \"public\".\"players\".\"team\" AS \"team\", COUNT(*) AS \"count\" FROM \"public\".\"players\" "
     "GROUP BY \"public\".\"players\".\"team\" ORDER BY \"public\".\"players\".\"team\" ASC"),
    ("Metabase", "postgres driver, a sum by hour",
     "SELECT DATE_TRUNC('hour', \"public\".\"per_minute\".\"window_start\") AS \"window_start\", "
     "SUM(\"public\".\"per_minute\".\"points\") AS \"sum\" FROM \"public\".\"per_minute\" "
     "GROUP BY DATE_TRUNC('hour', \"public\".\"per_minute\".\"window_start\") "
     "ORDER BY DATE_TRUNC('hour', \"public\".\"per_minute\".\"window_start\") ASC"),
    ("Tableau", "PostgreSQL connector, a measure by a dimension",
     "SELECT \"players\".\"team\" AS \"team\", SUM(\"players\".\"games\") AS \"sum:games:ok\" "
     "FROM \"public\".\"players\" \"players\" GROUP BY 1"),
    ("Tableau", "PostgreSQL connector, a measure by hour",
     "SELECT CAST(DATE_TRUNC('HOUR', CAST(\"per_minute\".\"window_start\" AS TIMESTAMP)) AS TIMESTAMP) "
     "AS \"thr:window_start:ok\", SUM(\"per_minute\".\"points\") AS \"sum:points:ok\" "
     "FROM \"public\".\"per_minute\" \"per_minute\" GROUP BY 1"),
    ("Grafana", "postgres datasource, $__timeGroupAlias(window_start, 1m) and $__timeFilter(window_start) expanded",
     "SELECT floor(extract(epoch from window_start)/60)*60 AS \"time\", sum(points) AS \"points\" "
     "FROM public.per_minute WHERE window_start BETWEEN '2023-11-14T22:00:00Z' AND '2023-11-15T00:00:00Z' "
     "GROUP BY 1 ORDER BY 1"),
]
