"""The user's statement as the receiver's DuckDB runs it: the user's own text, each store
reference pointed at the relation registered for it and each placeholder replaced by its
parameter's literal.

Written back from sqlglot's tree instead, a statement's names and at times its meaning change:
DuckDB names an unaliased column after its text (``+ x`` is ``(+(x))``, sqlglot drops the +;
``CAST(x AS VARCHAR)`` comes back as TEXT), and a unary + on a string, which DuckDB refuses,
is gone. The tree still decides what the owners do; only the text DuckDB reads is the user's.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.errors import TokenError
from sqlglot.tokens import TokenType

Span = tuple[int, int, str]  # text[start:end] is replaced by the string


@dataclass(frozen=True)
class Source:
    """A statement's text and what replaces its placeholders."""

    text: str
    placeholders: tuple[Span, ...] = ()

    def written(self, spans: list[Span]) -> str:
        """The text with ``spans`` and the placeholders replaced (spans do not overlap)."""
        out, at = [], 0
        for start, end, new in sorted([*spans, *self.placeholders]):
            out += [self.text[at:start], new]
            at = end
        out.append(self.text[at:])
        return "".join(out)


def source(text: str, tree: exp.Expression, literals: list[str]) -> Source | None:
    """``text`` (DuckDB's dialect) whose parse is ``tree``, the ``literals`` of its parameters
    in their order; None when its placeholders cannot all be found in it."""
    try:
        tokens = sqlglot.Dialect.get_or_raise("duckdb").tokenize(text)
    except TokenError:
        return None
    anonymous = sum(1 for n in tree.find_all(exp.Placeholder) if not n.this)
    numbered = sum(1 for n in tree.find_all(exp.Placeholder) if n.this)
    spans: list[Span] = []
    found = [0, 0]
    for tok, after in zip(tokens, [*tokens[1:], None]):
        if tok.token_type == TokenType.PLACEHOLDER and tok.text == "?":
            if found[0] >= len(literals):
                return None
            spans.append((tok.start, tok.end + 1, literals[found[0]]))
            found[0] += 1
        elif tok.token_type == TokenType.PARAMETER and after is not None and after.start == tok.end + 1 \
                and after.token_type == TokenType.NUMBER and after.text.isdigit():
            index = int(after.text) - 1
            if not 0 <= index < len(literals):
                return None
            spans.append((tok.start, after.end + 1, literals[index]))
            found[1] += 1
    if found != [anonymous, numbered]:
        return None
    return Source(text, tuple(spans))


def table_span(table: exp.Table) -> tuple[int, int] | None:
    """Where ``table``'s name (catalog and schema included) is in the text it was read from;
    None when that is not known."""
    parts = [p for p in (table.args.get("catalog"), table.args.get("db"), table.this) if p is not None]
    metas = [p.meta if isinstance(p, exp.Identifier) and p._meta else {} for p in parts]
    if not metas or any("start" not in m or "end" not in m for m in metas):
        return None
    return metas[0]["start"], metas[-1]["end"] + 1


def prefix_span(first: exp.Expression, name: exp.Expression) -> tuple[int, int] | None:
    """Where a qualifier stands in the text: from ``first`` (its first part) up to ``name``, the
    part it qualifies (the dots between included); None when that is not known."""
    metas = [p.meta if isinstance(p, exp.Identifier) and p._meta else {} for p in (first, name)]
    if any("start" not in m for m in metas):
        return None
    return metas[0]["start"], metas[1]["start"]
