"""The node's DuckDB: sandboxed, bounded, and its errors in our codes."""

from __future__ import annotations

import time

import pyarrow as pa
import pytest

from federator.owner.duck import Duck, DuckConfig
from federator.errors import SqlError
from federator.sql.parse import parse


@pytest.fixture(scope="module")
def duck(tmp_path_factory) -> Duck:
    return Duck(DuckConfig(memory_limit="256MB", spill_dir=tmp_path_factory.mktemp("spill")))


def run(duck: Duck, sql: str, relations: dict | None = None, deadline: float | None = None) -> pa.Table:
    schema, batches = duck.stream(sql, relations or {}, deadline)
    return pa.Table.from_batches(list(batches), schema)


@pytest.mark.parametrize("sql", [
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM read_parquet('/etc/passwd')",
    "SELECT * FROM read_json_auto('/etc/passwd')",
    "SELECT * FROM glob('/*')",
    "SELECT * FROM read_text('/etc/hostname')",
    "SELECT getenv('HOME')",
    "COPY (SELECT 1) TO '/tmp/federator-sandbox-test.csv'",
    "ATTACH '/tmp/federator-sandbox-test.db'",
    "INSTALL httpfs",
    "LOAD httpfs",
    "SET memory_limit = '100GB'",
    "SET enable_external_access = true",
    "PRAGMA memory_limit = '100GB'",
])
def test_user_sql_reaches_no_file_network_extension_or_setting(duck, sql) -> None:
    with pytest.raises(SqlError) as info:
        run(duck, sql)
    assert info.value.status in (400, 422), (info.value.code, info.value.message)
    assert run(duck, "SELECT current_setting('enable_external_access') AS v").column("v").to_pylist() == [False]


@pytest.mark.parametrize("sql", [
    "COPY players TO '/tmp/x.csv'", "ATTACH '/tmp/x.db'", "INSTALL httpfs", "LOAD httpfs", "PRAGMA version",
    "SET memory_limit = '1GB'", "CREATE TABLE t (x INT)", "INSERT INTO players VALUES (1)", "DROP TABLE players",
])
def test_statements_that_are_not_reads_are_refused_before_duckdb(sql) -> None:
    with pytest.raises(SqlError) as info:
        parse(sql)
    assert info.value.code == "UNSUPPORTED" and info.value.status == 422


@pytest.mark.parametrize(("sql", "code", "status"), [
    ("SELECT CAST('x' AS INTEGER)", "INVALID_DATA", 400),
    ("SELECT 9223372036854775807::BIGINT + 1", "INVALID_DATA", 400),
    ("SELECT 1 // 0", "INVALID_DATA", 400),
    ("SELECT nosuch FROM (SELECT 1 AS a)", "UNKNOWN_COLUMN", 404),
    ("SELECT no_such_function(1)", "SQL_PARSE_ERROR", 400),
    ("SELECT 1 +", "SQL_PARSE_ERROR", 400),
])
def test_duckdb_errors_map_to_our_codes_with_duckdbs_words(duck, sql, code, status) -> None:
    with pytest.raises(SqlError) as info:
        run(duck, sql)
    assert (info.value.code, info.value.status) == (code, status)
    assert "LINE 1" not in info.value.message and info.value.message


def test_a_query_past_its_deadline_is_interrupted(duck) -> None:
    """A query that would run for years ends with TIMEOUT: only the interrupt can end it. It runs
    in a thread, so a query that is not interrupted fails the test instead of hanging it."""
    from tests.threads import Worker

    errors: list[SqlError] = []

    def endless() -> None:
        with pytest.raises(SqlError) as info:
            run(duck, "SELECT count(*) FROM range(4611686018427387904) a", deadline=time.monotonic() + 0.2)
        errors.append(info.value)

    w = Worker(endless)
    w.start()
    w.join_checked(120)  # not a time limit on the interrupt: a bound on how long a hang may take to fail
    (err,) = errors
    assert err.code == "TIMEOUT" and err.status == 504


def test_each_query_is_interrupted_at_its_own_deadline_and_no_other(duck) -> None:
    """One thread keeps every deadline: an endless query with a later deadline is not ended by an
    earlier one's, queries that finish in time are never interrupted, and the endless ones end."""
    from tests.threads import Worker

    ended: dict[str, str] = {}

    def endless(name: str, after: float) -> None:
        with pytest.raises(SqlError) as info:
            run(duck, "SELECT count(*) FROM range(4611686018427387904) a", deadline=time.monotonic() + after)
        ended[name] = info.value.code

    workers = [Worker(endless, "late", 1.0), Worker(endless, "early", 0.2)]
    for w in workers:
        w.start()
    for _ in range(50):  # meanwhile, quick queries with distant deadlines answer
        assert run(duck, "SELECT 41 + 1 AS x", deadline=time.monotonic() + 60).column("x").to_pylist() == [42]
    for w in workers:
        w.join_checked(120)
    assert ended == {"early": "TIMEOUT", "late": "TIMEOUT"}
    assert run(duck, "SELECT 1 AS x", deadline=time.monotonic() + 60).column("x").to_pylist() == [1]


def test_a_query_sees_only_the_relations_registered_for_it(duck) -> None:
    rows = pa.table({"x": [1, 2, 3]})
    assert run(duck, "SELECT sum(x) AS s FROM t", {"t": rows}).column("s").to_pylist() == [6]
    with pytest.raises(SqlError):
        run(duck, "SELECT * FROM t")  # another query's relation is gone with its cursor


def test_a_bad_memory_limit_names_the_flag() -> None:
    with pytest.raises(ValueError, match="--duckdb-memory-limit"):
        Duck(DuckConfig(memory_limit="lots"))


def test_every_query_runs_in_utc_whatever_the_machines_zone(duck) -> None:
    table = run(duck, "SELECT TIMESTAMPTZ '2024-01-01 00:00:00+00' AS t, current_setting('TimeZone') AS z")
    assert table.schema.field("t").type.tz == "UTC" and table.column("z").to_pylist() == ["UTC"]


def test_a_data_error_met_while_streaming_is_invalid_data(duck) -> None:
    """DuckDB reports some errors through the Arrow reader (as OSError): still the user's 400."""
    rows = pa.table({"price": [1.0, 2.0], "id": [0, 1]})
    with pytest.raises(SqlError) as info:
        run(duck, "SELECT CAST((price / id) AS BIGINT) FROM t", {"t": rows})
    assert info.value.code == "INVALID_DATA" and "out of range" in info.value.message


@pytest.mark.parametrize("sql", ["SELECT current_setting('temp_directory')", "SELECT * FROM duckdb_settings()",
                                 "SELECT * FROM pragma_database_list()", "SELECT 1 FROM t WHERE getvariable('x')"])
def test_the_engines_own_settings_and_files_are_not_exposed(sql) -> None:
    from federator.sql.planner import bind_parameters, plan_query

    stmt = parse(sql)
    with pytest.raises(SqlError) as info:
        plan_query(bind_parameters(stmt.select, [], 0), lambda name: None, lambda name: None, [], lambda s, r: None)
    assert info.value.code == "UNSUPPORTED" and "GET /v1/metadata" in info.value.message
