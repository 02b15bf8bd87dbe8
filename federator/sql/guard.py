"""Bounds on SQL text, checked before a parser sees it: length, NUL characters, nesting depth.

sqlglot parses by recursive descent, about 20-25 Python frames per level of parentheses,
brackets, CASE or function call, so under the default recursion limit (1,000) it fails near 40
levels. 32 levels leaves room for the planner's own recursion. Raising the limit is no way out:
it is one setting for the whole process, whose request threads granian starts with small stacks.
Input this refuses fails fast with a 400 instead of recursing.
"""

from __future__ import annotations

import re

from federator.errors import SqlError
from federator.settings import NodeSettings

MAX_SQL_CHARS = NodeSettings.max_sql_chars  # the parser's bound, and the node's default cap
MAX_SQL_DEPTH = 32
# what nests (and what to skip: strings, quoted identifiers, comments, $$ strings)
_NESTING = re.compile(
    r"""'[^']*(?:''[^']*)*'?|"[^"]*(?:""[^"]*)*"?|--[^\n]*|/\*.*?(?:\*/|\Z)|\$\$.*?(?:\$\$|\Z)"""
    r"""|[(\[{]|[)\]}]|\b(?:CASE|END)\b""",
    re.IGNORECASE | re.DOTALL,
)
_OPENERS = frozenset("([{")


def _line_col(sql: str, at: int) -> tuple[int, int]:
    return sql.count("\n", 0, at) + 1, at - sql.rfind("\n", 0, at)


def check_input(sql: str) -> None:
    """Refuse SQL too long, holding a NUL or nested too deep, before any parser recurses into it."""
    if len(sql) > MAX_SQL_CHARS:
        raise SqlError("SQL_PARSE_ERROR", f"the SQL is {len(sql):,} characters long; at most {MAX_SQL_CHARS:,} (1 MiB) "
                                          "are accepted: split the query, or pass long value lists as parameters")
    nul = sql.find("\x00")
    if nul >= 0:
        line, col = _line_col(sql, nul)
        raise SqlError("SQL_PARSE_ERROR", f"the SQL holds a NUL character (U+0000) at line {line}, column {col}; "
                                          "remove it (chr(0) writes one into a value)", line=line, col=col)
    depth = deepest = deepest_at = 0
    for m in _NESTING.finditer(sql):
        token = m.group()
        if token[0] in _OPENERS or token.upper() == "CASE":
            depth += 1
            if depth > deepest:
                deepest, deepest_at = depth, m.start()
        elif token[0] in ")]}" or token.upper() == "END":
            depth = max(0, depth - 1)
    if deepest > MAX_SQL_DEPTH:
        line, col = _line_col(sql, deepest_at)
        raise SqlError("SQL_PARSE_ERROR", f"the SQL nests {deepest} levels deep (parentheses, brackets, CASE) at line "
                                          f"{line}, column {col}; at most {MAX_SQL_DEPTH} are accepted: flatten it",
                       line=line, col=col)
