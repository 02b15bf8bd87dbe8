"""The Postgres wire protocol with real clients: psycopg 3, asyncpg, SQLAlchemy + pandas, psql and
pgjdbc (Debian's), against the shared three-node cluster (every node has --pg-port).

Answers are compared with DuckDB's over the same rows (``bi_cluster.db``). The module sorts
before test_console.py and test_dbapi.py, so the three share one ``bi_cluster``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import decimal
import os
import shutil
import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

psycopg = pytest.importorskip("psycopg")

from tests.integration.bi_cluster import BiCluster, bi_cluster, unqualified  # noqa: F401,E402 - bi_cluster is a fixture
from tests.integration.tool_venv import sqla14_python  # noqa: E402
from tests.integration.pg_tool_queries import DATA_QUERIES, QUERIES  # noqa: E402
from tests.integration.test_connect_names import bag  # noqa: E402
from tests.integration.test_sql import post  # noqa: E402

PSQL = shutil.which("psql")
PGJDBC = next((p for p in ("/usr/share/java/postgresql.jar", "/usr/share/java/postgresql-jdbc4.jar") if Path(p).exists()), None)


def dsn(c: BiCluster, node: int = 0, **extra: str) -> str:
    opts = " ".join(f"{k}={v}" for k, v in extra.items())
    return f"host=127.0.0.1 port={c.nodes[node].pg_port} dbname=federator user=tester {opts}"


def utc(rows: list[tuple]) -> list[tuple]:
    return [tuple(v.astimezone(dt.timezone.utc) if isinstance(v, dt.datetime) and v.tzinfo else v for v in r) for r in rows]


def duck(c: BiCluster, sql: str, params: list | None = None) -> list[tuple]:
    return utc(c.db.execute(sql, params or []).fetchall())


PLAYERS = "SELECT player, team, games, score, active, last_seen FROM players ORDER BY player"


@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
def test_psycopg_every_type_equals_duckdb(bi_cluster, binary) -> None:
    c = bi_cluster
    with psycopg.connect(dsn(c), autocommit=True) as conn:
        cur = conn.cursor(binary=binary)
        cur.execute(PLAYERS)
        assert utc(cur.fetchall()) == duck(c, PLAYERS)
        assert [d.name for d in cur.description] == ["player", "team", "games", "score", "active", "last_seen"]
        cur.execute("SELECT id, payload FROM blobs ORDER BY id")
        assert cur.fetchall() == duck(c, "SELECT id, payload FROM blobs ORDER BY id")
        cur.execute("SELECT CAST(score AS DECIMAL(10,2)) AS s, CAST(last_seen AS DATE) AS d FROM players "
                    "WHERE score IS NOT NULL AND last_seen IS NOT NULL ORDER BY player")
        got = cur.fetchall()
        assert got == duck(c, "SELECT CAST(score AS DECIMAL(10,2)) AS s, CAST(last_seen AS DATE) AS d FROM players "
                              "WHERE score IS NOT NULL AND last_seen IS NOT NULL ORDER BY player")
        assert all(isinstance(r[0], decimal.Decimal) and isinstance(r[1], dt.date) for r in got)


def test_psycopg_parameters_and_server_side_prepare(bi_cluster) -> None:
    c = bi_cluster
    with psycopg.connect(dsn(c), autocommit=True, prepare_threshold=0) as conn:  # every statement prepared
        sql = "SELECT player, games FROM players WHERE games > %s AND team = %s ORDER BY player"
        for games, team in ((10, "red"), (50, "blue")):
            got = conn.execute(sql, (games, team)).fetchall()
            assert got == duck(c, sql.replace("%s", "?"), [games, team]) and got
        # a point lookup by key, routed to the key's owner whichever node the client is on
        for node in range(3):
            with psycopg.connect(dsn(c, node), autocommit=True) as other:
                assert other.execute("SELECT games FROM players WHERE player = %s", ("p012",)).fetchall() == [(36,)]
        ts = dt.datetime.fromtimestamp(1_700_000_000, dt.timezone.utc)
        got = conn.execute("SELECT count(*) FROM players WHERE last_seen > %s", (ts,)).fetchall()
        assert got == duck(c, "SELECT count(*) FROM players WHERE last_seen > ?", [ts])


def test_session_settings_token_and_transactions(bi_cluster) -> None:
    c = bi_cluster
    with psycopg.connect(dsn(c)) as conn:  # not autocommit: psycopg sends BEGIN first
        cur = conn.cursor()
        cur.execute("SELECT count(*) FROM players")
        assert cur.fetchone() == (len(c.players),)
        token = cur.execute("SHOW federator.consistency_token").fetchone()[0]
        assert token and token != ""
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        conn.commit()
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        # the token as the bound of later reads, and the consistency options as settings
        cur.execute("SET federator.consistency_token = %s" % psycopg.sql.quote(token))
        cur.execute("SET federator.allow_stale = on")
        cur.execute("SET federator.max_lag = 0")
        cur.execute("SELECT count(*) FROM players")
        assert cur.fetchone() == (len(c.players),)
        assert cur.execute("SHOW federator.allow_stale").fetchone() == ("on",)
        assert cur.execute("SELECT current_setting('federator.max_lag')").fetchone() == ("0",)
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="allow_stale must be on or off"):
            cur.execute("SET federator.allow_stale = maybe")
        conn.rollback()
        # a token no node can reach is a typed error, not an old answer
        cur.execute("SET federator.consistency_token = 'not a token'")
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            cur.execute("SELECT count(*) FROM players")
        conn.rollback()


def test_errors_carry_sqlstate_and_leave_the_connection_usable(bi_cluster) -> None:
    c = bi_cluster
    with psycopg.connect(dsn(c), autocommit=True) as conn:
        with pytest.raises(psycopg.errors.UndefinedTable, match="unknown store"):
            conn.execute("SELECT * FROM no_such_store")
        with pytest.raises(psycopg.errors.UndefinedColumn):
            conn.execute("SELECT no_such_column FROM players")
        with pytest.raises(psycopg.errors.SyntaxError):
            conn.execute("SELEC 1")
        with pytest.raises(psycopg.errors.DataException):
            conn.execute("SELECT CAST(team AS INTEGER) FROM players WHERE team = 'red'")
        assert conn.execute("SELECT 1 + 1").fetchone() == (2,)


def test_catalog_queries_tools_send(bi_cluster) -> None:
    c = bi_cluster
    with psycopg.connect(dsn(c), autocommit=True) as conn:
        assert conn.execute("SELECT version()").fetchone()[0].startswith("PostgreSQL 16")
        assert conn.info.server_version >= 160000
        assert conn.execute("SELECT current_schema(), current_database(), current_user").fetchone() == \
               ("public", "federator", "tester")
        tables = conn.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' "
                              "ORDER BY table_name").fetchall()
        assert tables == [("blobs",), ("per_minute",), ("players",)]
        cols = conn.execute("""
            SELECT a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod), a.attnotnull
            FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
            JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
            WHERE c.relname = 'players' AND n.nspname = 'public' AND a.attnum > 0 ORDER BY a.attnum""").fetchall()
        assert cols == [("player", "character varying", True), ("team", "character varying", False),
                        ("games", "bigint", False), ("score", "double precision", False),
                        ("active", "boolean", False), ("last_seen", "timestamp with time zone", False),
                        ("rowtime", "timestamp with time zone", False)]
        # the key is the primary key
        pk = conn.execute("""SELECT kcu.column_name FROM information_schema.table_constraints tc
            JOIN information_schema.key_column_usage kcu ON kcu.constraint_name = tc.constraint_name
            WHERE tc.table_name = 'blobs' AND tc.constraint_type = 'PRIMARY KEY'""").fetchall()
        assert pk == [("id",)]


def test_cursors_declare_fetch_and_row_limits(bi_cluster) -> None:
    c = bi_cluster
    with psycopg.connect(dsn(c)) as conn:
        # a named cursor is DECLARE ... CURSOR + FETCH FORWARD n, as Tableau and psycopg send it
        with conn.cursor(name="big") as cur:
            cur.itersize = 7
            cur.execute("SELECT player FROM players ORDER BY player")
            assert [r[0] for r in cur] == [p["player"] for p in sorted(c.players, key=lambda p: p["player"])]
        conn.rollback()


def test_asyncpg_binary_protocol(bi_cluster) -> None:
    asyncpg = pytest.importorskip("asyncpg")
    c = bi_cluster

    async def run() -> None:
        conn = await asyncpg.connect(host="127.0.0.1", port=c.nodes[1].pg_port, user="tester", database="federator")
        try:
            rows = await conn.fetch("SELECT player, team, games, score, active, last_seen FROM players "
                                    "WHERE games > $1 ORDER BY player", 30)
            assert [tuple(r) for r in rows] == duck(c, PLAYERS.replace("ORDER BY", "WHERE games > 30 ORDER BY"))
            blob = await conn.fetchval("SELECT payload FROM blobs WHERE id = $1", 7)
            assert blob == duck(c, "SELECT payload FROM blobs WHERE id = 7")[0][0]
            total = await conn.fetchval("SELECT CAST(sum(score) AS DECIMAL(12,2)) FROM players")
            assert total == duck(c, "SELECT CAST(sum(score) AS DECIMAL(12,2)) FROM players")[0][0]
        finally:
            await conn.close()

    asyncio.run(run())


def test_sqlalchemy_and_pandas_read_sql(bi_cluster) -> None:
    sqlalchemy = pytest.importorskip("sqlalchemy")
    pd = pytest.importorskip("pandas")
    c = bi_cluster
    engine = sqlalchemy.create_engine(f"postgresql+psycopg://tester@127.0.0.1:{c.nodes[2].pg_port}/federator")
    try:
        frame = pd.read_sql("SELECT team, count(*) AS n FROM players GROUP BY team ORDER BY team NULLS FIRST", engine)
        assert [tuple(r) for r in frame.itertuples(index=False)] == \
               duck(c, "SELECT team, count(*) AS n FROM players GROUP BY team ORDER BY team NULLS FIRST")
    finally:
        engine.dispose()


@pytest.mark.skipif(PSQL is None, reason="Debian's postgresql-client (psql) is missing: make test installs it")
def test_psql_queries_and_describe(bi_cluster) -> None:
    c = bi_cluster
    env = {**os.environ, "PGHOST": "127.0.0.1", "PGPORT": str(c.nodes[0].pg_port), "PGUSER": "tester",
           "PGDATABASE": "federator", "PGCONNECT_TIMEOUT": "10"}

    def psql(*args: str) -> str:
        done = subprocess.run([PSQL, "-X", "-v", "ON_ERROR_STOP=1", *args], env=env, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    out = psql("-A", "-t", "-c", "SELECT player, games FROM players WHERE player IN ('p001', 'p002') ORDER BY player")
    assert out.split() == ["p001|3", "p002|6"]
    listing = psql("-c", r"\dt")
    assert "players" in listing and "per_minute" in listing and "blobs" in listing
    described = psql("-c", r"\d players")
    assert "last_seen" in described and "timestamp with time zone" in described and "bigint" in described
    assert '"players_pkey" PRIMARY KEY, btree (player)' in described


JAVA = Path(__file__).parent / "java" / "PgjdbcCheck.java"
INSPECT = Path(__file__).parent / "pg_inspect.py"


needs_pgjdbc = pytest.mark.skipif(
    PGJDBC is None or shutil.which("javac") is None,
    reason="Debian's libpostgresql-jdbc-java (make test installs it) or a JDK's javac is missing")


def _java(source: Path, tmp_path: Path, *args: str) -> list[str]:
    """The lines a Java check of java/ printed, compiled and run against pgjdbc."""
    done = subprocess.run(["javac", "-d", str(tmp_path), "-cp", PGJDBC, str(source)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    run = subprocess.run(["java", "-cp", f"{tmp_path}:{PGJDBC}", source.stem, *args], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    return run.stdout.splitlines()


@needs_pgjdbc
def test_pgjdbc_metadata_and_a_paged_prepared_statement(bi_cluster, tmp_path) -> None:
    c = bi_cluster
    lines = _java(JAVA, tmp_path, f"jdbc:postgresql://127.0.0.1:{c.nodes[1].pg_port}/federator")
    assert lines[0] == "product PostgreSQL 16"
    assert [x for x in lines if x.startswith("table ")] == ["table public.blobs", "table public.per_minute",
                                                                  "table public.players"]
    assert [x for x in lines if x.startswith("column ")] == [
        "column player varchar 12 NO", "column team varchar 12 YES", "column games int8 -5 YES",
        "column score float8 8 YES", "column active bool -7 YES", "column last_seen timestamptz 93 YES",
        "column rowtime timestamptz 93 YES"]
    assert [x for x in lines if x.startswith("pk ")] == ["pk player 1 players_pkey"]
    expected = duck(c, "SELECT player, games, score, last_seen FROM players WHERE games > 20 AND team = 'red' "
                       "ORDER BY player")
    assert [x for x in lines if x.startswith("row ")] == [
        f"row {p} {g} {'null' if s is None else s} {'null' if t is None else int(t.timestamp() * 1000)}" for p, g, s, t in expected]
    assert f"rows {len(expected)}" in lines and len(expected) > 3  # more rows than one page of 3


# pgjdbc's TYPE_NAME and java.sql.Types of each SQL type /v1/stores gives a column
JDBC_TYPES = {"VARCHAR": ("varchar", 12), "BIGINT": ("int8", -5), "INTEGER": ("int4", 4), "DOUBLE": ("float8", 8),
              "BOOLEAN": ("bool", -7), "BLOB": ("bytea", -2), "TIMESTAMP WITH TIME ZONE": ("timestamptz", 93)}


@needs_pgjdbc
def test_dbeavers_jdbc_metadata_walk_matches_the_stores(bi_cluster, tmp_path) -> None:
    """DBeaver's navigator through pgjdbc's DatabaseMetaData: what it lists is what GET /v1/stores says."""
    c = bi_cluster
    status, listing = c.nodes[0].client.get_json("/v1/stores")
    assert status == 200
    stores = {s["name"]: s for s in listing["stores"]}
    lines = _java(JAVA.parent / "JdbcMetadataWalk.java", tmp_path,
                  f"jdbc:postgresql://127.0.0.1:{c.nodes[2].pg_port}/federator")

    def kind(word: str) -> list[str]:
        return [x[len(word) + 1:] for x in lines if x.startswith(word + " ")]

    assert kind("catalog") == ["federator"]
    assert kind("schema") == ["pg_catalog", "public"]
    assert kind("table") == [f"public {name} TABLE" for name in sorted(stores)]  # no view: a store is a table
    columns, pks, indexes = [], [], []
    for name in sorted(stores):
        key = stores[name]["key"]["name"]
        for i, col in enumerate(stores[name]["columns"], start=1):
            type_name, java_type = JDBC_TYPES[col["type"]]
            nullable = col["name"] != key
            columns.append(f"{name} {i} {col['name']} {type_name} {java_type} {int(nullable)} {'YES' if nullable else 'NO'}")
        pks.append(f"{name} {key} 1 {name}_pkey")
        indexes.append(f"{name} {name}_pkey {key} 1 unique")
    assert kind("column") == columns
    assert kind("pk") == pks and kind("index") == indexes
    assert kind("fk") == []  # stores reference no other store
    types = dict(t.split() for t in kind("type"))
    assert {JDBC_TYPES[col["type"]][0] for s in stores.values() for col in s["columns"]} <= set(types)
    assert all(int(types[name]) == java for name, java in JDBC_TYPES.values())


def test_a_cancel_request_stops_the_running_statement(bi_cluster) -> None:
    import threading

    c = bi_cluster
    with psycopg.connect(dsn(c), autocommit=True) as conn:
        conn.execute("SET statement_timeout = 600000")  # ten minutes: only the cancel can end it sooner
        # a join the receiver's DuckDB would take many minutes over
        long = "SELECT count(*) FROM players a, range(5000000000) r WHERE r.range % 7 = length(a.player)"
        timer = threading.Timer(2.0, conn.cancel_safe)
        timer.start()
        try:
            with pytest.raises(psycopg.errors.QueryCanceled, match="canceling statement due to user request"):
                conn.execute(long)
        finally:
            timer.cancel()
        assert conn.execute("SELECT count(*) FROM players").fetchone() == (len(c.players),)


@pytest.mark.parametrize("tool,where,sql,params,check", QUERIES, ids=[f"{q[0]}: {q[1]}" for q in QUERIES])
def test_catalog_queries_of_bi_tools(bi_cluster, tool, where, sql, params, check) -> None:
    with psycopg.connect(dsn(bi_cluster), autocommit=True) as conn:
        rows = conn.execute(sql, params or None).fetchall()
    assert check(rows), rows[:10]


@pytest.mark.parametrize("python,driver", [(None, "psycopg"), ("1.4", "psycopg2")],
                         ids=["sqlalchemy 2 and psycopg 3", "sqlalchemy 1.4 and psycopg2"])
def test_sqlalchemy_inspector_finds_the_stores_as_superset_asks(bi_cluster, python, driver) -> None:
    """Superset's dataset editor: schemas, tables, a store's columns, key, indexes, then a query."""
    c = bi_cluster
    exe = str(sqla14_python()) if python else sys.executable
    url = f"postgresql+{driver}://tester@127.0.0.1:{c.nodes[1].pg_port}/federator"
    done = subprocess.run([exe, str(INSPECT), url], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout)
    assert found["version"].startswith("1.4" if python else "2.")
    assert found["schemas"] == ["public"] and found["default_schema"] == "public"
    assert found["tables"] == found["public_tables"] == ["blobs", "per_minute", "players"]
    assert found["columns"] == [["player", "VARCHAR", None, False], ["team", "VARCHAR", None, True],
                                ["games", "BIGINT", None, True], ["score", "DOUBLE_PRECISION", None, True],
                                ["active", "BOOLEAN", None, True], ["last_seen", "TIMESTAMP", True, True],
                                ["rowtime", "TIMESTAMP", True, True]]
    assert found["pk"] == ["players_pkey", ["player"]]
    assert found["indexes"] == [] and found["foreign_keys"] == [] and found["views"] == []  # as Postgres: the key's index is the pk's
    assert found["has_table"] == [True, True, False]
    assert [tuple(r) for r in found["rows"]] == duck(
        c, "SELECT team, count(*) AS n FROM players GROUP BY team ORDER BY team NULLS FIRST")


@pytest.mark.parametrize("tool,where,sql", DATA_QUERIES, ids=[f"{q[0]}: {q[1]}" for q in DATA_QUERIES])
def test_data_queries_of_bi_tools_equal_duckdb_and_http(bi_cluster, tool, where, sql) -> None:
    c = bi_cluster
    with psycopg.connect(dsn(c), autocommit=True) as conn:
        got = bag(utc(conn.execute(sql).fetchall()))  # no parameters: the simple protocol, as psycopg2 sends
    want = bag(duck(c, unqualified(sql)))
    assert got == want and want, (got[:5], want[:5])
    resp = post(c.nodes[2], {"sql": sql, "dialect": "postgres", "format": "arrow"})
    assert resp.status == 200, resp.data[:300]
    over_http = pa.ipc.open_stream(resp.data).read_all()
    assert bag(utc([tuple(r.values()) for r in over_http.to_pylist()])) == want
