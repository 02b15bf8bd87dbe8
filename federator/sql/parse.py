"""Parsing: SQL text → one statement, classified; errors with line and column."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from federator.errors import SqlError, unsupported
from federator.sql.guard import check_input

_EXPLAIN = re.compile(r"^\s*EXPLAIN\s+", re.IGNORECASE)
_SHOW_TABLES = re.compile(r"^\s*SHOW\s+TABLES\s*;?\s*$", re.IGNORECASE)
_DESCRIBE = re.compile(r"^\s*(?:DESCRIBE|DESC)\s+(?:TABLE\s+)?([A-Za-z_][A-Za-z0-9_]*|\"[^\"]+\")\s*;?\s*$", re.IGNORECASE)

_READS = (exp.Select, exp.SetOperation, exp.Values, exp.Subquery)
_WRITES = (exp.Insert, exp.Update, exp.Delete, exp.Create, exp.Drop, exp.Alter, exp.Merge, exp.TruncateTable)


@dataclass(frozen=True)
class Statement:
    kind: str  # select | show_tables | describe
    select: exp.Expression | None = None  # a query: SELECT, a set operation, VALUES
    table: str | None = None
    explain: bool = False
    param_count: int = 0
    text: str = ""  # the SQL ``select`` was read from (its positions are in it)


DIALECT = "duckdb"  # what the engine runs; a request may write in another that sqlglot reads


def dialect_of(name: str | None) -> str:
    """The sqlglot dialect a request names (default DuckDB's), or INVALID_PARAMETER listing them."""
    if name is None or name.lower() == DIALECT:
        return DIALECT
    from sqlglot.dialects.dialect import Dialect, Dialects

    try:
        Dialect.get_or_raise(name.lower())
    except ValueError:
        known = ", ".join(sorted(d.value for d in Dialects if d.value))
        raise SqlError("INVALID_PARAMETER", f"unknown SQL dialect {name!r}; dialects are: {known}") from None
    return name.lower()


@functools.lru_cache(maxsize=2048)
def parse(sql: str, dialect: str = DIALECT) -> Statement:
    """Parse once per SQL text and dialect (parameterized queries are parsed once); the tree is
    sqlglot's, which the planner writes back as DuckDB's SQL. Do not mutate the result."""
    check_input(sql)
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
        statements = [s for s in sqlglot.parse(sql, read=dialect) if s is not None]
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
    except RecursionError:  # nesting that check_input does not count, such as a long chain of NOTs
        raise SqlError("SQL_PARSE_ERROR", "the SQL is nested too deeply to parse; flatten it") from None
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
    if not isinstance(stmt, _READS):
        raise unsupported(f"the statement {stmt.sql()[:60]!r}", "send a SELECT")
    if dialect != DIALECT:
        stmt = _numbered_parameters(stmt)
    return Statement("select", select=stmt, explain=explain, param_count=_number_placeholders(stmt), text=sql)


def _numbered_parameters(stmt: exp.Expression) -> exp.Expression:
    """Postgres's (and other dialects') $1, $2 ... as the placeholders DuckDB's $n are: sqlglot
    reads them there as parameters."""
    def placeholder(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Parameter) and isinstance(node.this, exp.Literal) and not node.this.is_string:
            return exp.Placeholder(this=str(node.this.this))
        return node

    return stmt.transform(placeholder)


def _number_placeholders(stmt: exp.Expression) -> int:
    """Give each placeholder the index of its value in the parameters list; returns how many
    values the statement takes. The ? placeholders count left to right in text order, not tree
    order: a tree walk visits LIMIT before WHERE (`WHERE x = ? LIMIT ?` bound backwards). $k takes
    the k-th value, as in DuckDB: $1 used twice takes one value, and $2, $1 swaps the first two."""
    anonymous = _anonymous_in_text_order(stmt)
    numbered = [n for n in stmt.find_all(exp.Placeholder, bfs=False) if n.this]
    if anonymous and numbered:
        raise SqlError("INVALID_PARAMETER", f"the SQL mixes ? and ${numbered[0].this} placeholders; use one kind")
    for i, node in enumerate(anonymous):
        node.meta["param_index"] = i
    used = set()
    for node in numbered:
        text = str(node.this)
        if not text.isdigit():
            raise SqlError("INVALID_PARAMETER", f"the placeholder ${text} has a name, but parameters are a list: "
                                                "use ? or $1, $2, ...")
        if int(text) == 0:
            raise SqlError("INVALID_PARAMETER", f"the placeholder ${text} does not exist: parameters count from $1")
        node.meta["param_index"] = int(text) - 1
        used.add(int(text))
    missing = min(set(range(1, len(used) + 1)) - used, default=None)
    if missing is not None:  # DuckDB refuses gaps too: a value nothing takes is a mistake
        raise SqlError("INVALID_PARAMETER", f"the placeholder ${max(used)} leaves ${missing} unused: number the "
                                            "placeholders $1, $2, ... without gaps, one per parameter")
    return len(anonymous) + len(used)


_MARK = "zzfederatorparam{}zz"


def _anonymous_in_text_order(tree: exp.Expression) -> list[exp.Placeholder]:
    """The `?` placeholders of `tree` in the order they appear in the SQL text.

    sqlglot keeps no token positions on placeholders, and a tree walk visits LIMIT before FROM,
    so the order comes from the generator, which writes clauses in SQL's grammar order: mark
    each `?` of a copy, render it, and read the marks back."""
    nodes = [n for n in tree.walk() if isinstance(n, exp.Placeholder) and not n.this]
    if not nodes:
        return []
    copy = tree.copy()
    marks = [n for n in copy.walk() if isinstance(n, exp.Placeholder) and not n.this]
    for i, node in enumerate(marks):
        node.set("this", _MARK.format(i))
    order = [int(m) for m in re.findall(_MARK.format(r"(\d+)"), copy.sql(dialect="duckdb"))]
    return [nodes[i] for i in order]
