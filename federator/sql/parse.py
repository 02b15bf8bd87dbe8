"""Parsing: SQL text → one statement, classified; errors with line and column."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from federator.sql.errors import SqlError, unsupported
from federator.sql.evaluate import _anonymous_in_text_order

_EXPLAIN = re.compile(r"^\s*EXPLAIN\s+", re.IGNORECASE)
_SHOW_TABLES = re.compile(r"^\s*SHOW\s+TABLES\s*;?\s*$", re.IGNORECASE)
_DESCRIBE = re.compile(r"^\s*(?:DESCRIBE|DESC)\s+(?:TABLE\s+)?([A-Za-z_][A-Za-z0-9_]*|\"[^\"]+\")\s*;?\s*$", re.IGNORECASE)

_WRITES = (exp.Insert, exp.Update, exp.Delete, exp.Create, exp.Drop, exp.Alter, exp.Merge, exp.TruncateTable)


@dataclass(frozen=True)
class Statement:
    kind: str  # select | show_tables | describe
    select: exp.Select | None = None
    table: str | None = None
    explain: bool = False
    param_count: int = 0


@functools.lru_cache(maxsize=2048)
def parse(sql: str) -> Statement:
    """Parse once per SQL text (parameterized queries are parsed once). Do not mutate the result."""
    explain = False
    m = _EXPLAIN.match(sql)
    if m:
        explain, sql = True, sql[m.end():]
    if _SHOW_TABLES.match(sql):
        return Statement("show_tables", explain=explain)
    d = _DESCRIBE.match(sql)
    if d:
        return Statement("describe", table=d.group(1).strip('"'), explain=explain)
    try:
        statements = [s for s in sqlglot.parse(sql, read="duckdb") if s is not None]
    except ParseError as e:
        first = e.errors[0] if e.errors else {}
        raise SqlError(
            "SQL_PARSE_ERROR",
            f"{first.get('description') or e}; check the SQL near line {first.get('line')}, column {first.get('col')}",
            line=first.get("line"),
            col=first.get("col"),
        ) from None
    except TokenError as e:
        raise SqlError("SQL_PARSE_ERROR", f"cannot read the SQL: {e}") from None
    if not statements:
        raise SqlError("SQL_PARSE_ERROR", "the SQL is empty; send one SELECT statement")
    if len(statements) > 1:
        raise unsupported("more than one statement", "send one statement per request")
    stmt = statements[0]
    if isinstance(stmt, _WRITES) or isinstance(stmt, exp.Command):
        kind = stmt.key.upper() if not isinstance(stmt, exp.Command) else str(stmt.this).upper()
        raise SqlError(
            "UNSUPPORTED",
            f"{kind} is not a read: Federator only reads (SELECT, SHOW TABLES, DESCRIBE, EXPLAIN); "
            "the pipeline writes the stores",
        )
    if isinstance(stmt, exp.Describe):
        return Statement("describe", table=stmt.this.name, explain=explain)
    if isinstance(stmt, (exp.Union, exp.Intersect, exp.Except)):
        raise unsupported(f"{stmt.key.upper()} of queries", "query one store at a time")
    if not isinstance(stmt, exp.Select):
        raise unsupported(f"the statement {stmt.sql()[:60]!r}", "send a SELECT")
    # Number the ? placeholders left to right, as the parameters list is given. In text order,
    # not tree order: a tree walk visits LIMIT before WHERE (`WHERE x = ? LIMIT ?` bound backwards).
    nodes = _anonymous_in_text_order(stmt) + [n for n in stmt.find_all(exp.Placeholder, bfs=False) if n.this]
    for count, node in enumerate(nodes):
        node.meta["param_index"] = count
    return Statement("select", select=stmt, explain=explain, param_count=len(nodes))
