"""`?` parameters bind in the order they appear in the SQL text, whatever the clause; a
request may write its SQL in another dialect."""

from __future__ import annotations

import pytest

from federator.errors import SqlError
from federator.sql.parse import dialect_of, parse
from federator.sql.planner import bind_parameters


def test_limit_and_offset_parameters_bind_after_where() -> None:
    # SQLAlchemy writes exactly this shape: WHERE ... LIMIT ? OFFSET ?
    stmt = parse("SELECT a FROM t WHERE b > ? AND c = ? ORDER BY a LIMIT ? OFFSET ?")
    assert stmt.param_count == 4
    bound = bind_parameters(stmt.select, [10, "x", 3, 1], stmt.param_count)
    assert bound.args["where"].sql() == "WHERE b > 10 AND c = 'x'"
    assert bound.args["limit"].sql() == "LIMIT 3" and bound.args["offset"].sql() == "OFFSET 1"


def test_select_list_parameters_come_first() -> None:
    stmt = parse("SELECT ? AS p, a FROM t WHERE a IN (?, ?) LIMIT ?")
    bound = bind_parameters(stmt.select, ["s", 1, 2, 5], stmt.param_count)
    assert bound.sql() == "SELECT 's' AS p, a FROM t WHERE a IN (1, 2) LIMIT 5"


@pytest.mark.parametrize(("dialect", "sql", "duckdb_sql"), [
    ("postgres", "SELECT a::text FROM t WHERE b = ANY(ARRAY[1, 2])", "SELECT CAST(a AS TEXT) FROM t WHERE b = ANY([1, 2])"),
    ("mysql", "SELECT `a`, IFNULL(b, 0) FROM t LIMIT 2, 5", 'SELECT "a", COALESCE(b, 0) FROM t LIMIT 5 OFFSET 2'),
    ("snowflake", "SELECT IFF(a > 1, 'y', 'n') FROM t", "SELECT CASE WHEN a > 1 THEN 'y' ELSE 'n' END FROM t"),
])
def test_a_request_may_write_in_another_dialect(dialect, sql, duckdb_sql) -> None:
    assert parse(sql, dialect_of(dialect)).select.sql(dialect="duckdb") == duckdb_sql


def test_an_unknown_dialect_is_a_bad_parameter_naming_the_known_ones() -> None:
    with pytest.raises(SqlError) as info:
        dialect_of("klingon")
    assert info.value.code == "INVALID_PARAMETER" and "postgres" in info.value.message


def test_a_long_in_list_of_parameters_binds_each_in_place() -> None:
    n = 2_000
    stmt = parse("SELECT a FROM t WHERE k IN (" + ", ".join("?" * n) + ") AND b = ?")
    bound = bind_parameters(stmt.select, [*range(n), "last"], stmt.param_count)
    assert bound.sql().endswith("IN (" + ", ".join(map(str, range(n))) + ") AND b = 'last'")
