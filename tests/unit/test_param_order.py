"""`?` parameters bind in the order they appear in the SQL text, whatever the clause."""

from __future__ import annotations

from federator.sql.parse import parse
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
