"""Counts, sums, minimums and maximums an owner keeps up to date from the rows that changed,
not from every row.

A partial aggregate the planner sends an owner is linear when each of its states is a COUNT
or an exact SUM (of integers or decimals): its value over the rows after some writes is its
value before, plus its value over the rows the writes added, minus its value over the rows
they replaced or deleted. The scan cache keeps those rows beside each kept scan
(federator.store.scan_cache), so right after a write the owner adds up a handful of rows
instead of running the statement over all of them. A MIN or MAX follows too, until a write
takes away a row holding the extreme itself (then the statement runs again): the rows
added can only push it further, the other rows removed never held it.

Only the plainest statements are followed: states of plain columns (``COUNT(*)``,
``COUNT(c)``, ``SUM(c)``, ``MIN(c)``, ``MAX(c)``), grouped by plain columns or not, with no
WHERE. Those need no
expression evaluated, so adding up the changed rows in Python is exact and takes microseconds,
where one DuckDB statement over a few rows costs about as much as over a million (its fixed
cost: federator.owner.duck registers each relation, and DuckDB plans the statement). Anything
else is computed over every row as before.

Two things a plain sum cannot tell are counted alongside, in columns the receiver never
sees: the rows of each group (a group whose rows all went must go too) and the non-NULL
inputs of each SUM, MIN and MAX (over no values they are NULL, not 0). Double sums (whose value
depends on the order of additions), floating minimums and maximums and group keys (NaN, -0.0,
which Python orders and groups unlike DuckDB) are not followed, nor a sum that leaves its
type's range: the full statement then answers, or fails, as DuckDB does.
"""

from __future__ import annotations

import decimal
import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import sqlglot
from sqlglot import exp

ROWS = "rows"
_COUNT_ROWS = "__n"
_DIGITS = 80  # exact for any sum of 38-digit decimals, with room to see one overflow
_PRECISION = 38  # digits of DuckDB's HUGEINT and DECIMAL(38) sums as Arrow gives them
_EXTREMES = {"min": min, "max": max}
_AGAIN = object()  # a state that cannot be followed: the statement runs again


@dataclass(frozen=True)
class State:
    name: str  # the output column
    kind: str  # "count", "sum", "min" or "max"
    column: str | None  # the row column it reads; None: COUNT(*)
    nonnull: str | None = None  # a sum's, min's or max's hidden count of non-NULL inputs


@dataclass(frozen=True)
class Maintained:
    """One owner statement, computed with its hidden counts so that it can be followed."""
    sql: str  # the statement with its hidden counts, over ``rows``
    visible: int  # its leading columns are the planner's statement's
    groups: tuple[tuple[str, str], ...]  # (output column, the row column it is)
    states: tuple[State, ...]  # in output order after the groups, hidden counts last

    def visible_part(self, result: pa.RecordBatch) -> pa.RecordBatch:
        return result.select(range(self.visible))

    def follow(self, kept: pa.RecordBatch, added: list[pa.RecordBatch],
               removed: list[pa.RecordBatch]) -> pa.RecordBatch | None:
        """``kept`` (this statement's result over earlier rows) after ``removed`` rows went and
        ``added`` came; None when that cannot be told exactly (the caller computes afresh).
        Python touches only the groups the changed rows fall in; the others are copied."""
        schema = kept.schema
        if any(_unhashable(schema.field(g).type) for g, _ in self.groups) or \
                not all(_exact(schema.field(s.name).type) for s in self.states if s.kind == "sum") or \
                not all(_ordered(schema.field(s.name).type) for s in self.states if s.kind in _EXTREMES):
            return None
        delta: dict[tuple[Any, ...], list[Any]] = {}
        with decimal.localcontext(prec=_DIGITS):
            for batches, sign in ((added, 1), (removed, -1)):
                for batch in batches:
                    if batch.num_rows and not self._add(delta, batch, sign):
                        return None
            if not delta:
                return kept
            return self._apply(kept, delta)

    def _add(self, totals: dict[tuple[Any, ...], list[Any]], rows: pa.RecordBatch, sign: int) -> bool:
        names = rows.schema.names
        if any(c not in names for _, c in self.groups) or any(s.column is not None and s.column not in names
                                                                 for s in self.states):
            return False
        keys = list(zip(*(rows.column(c).to_pylist() for _, c in self.groups))) if self.groups else [()] * rows.num_rows
        values = {c: rows.column(c).to_pylist() for c in {s.column for s in self.states if s.column is not None}}
        for i, key in enumerate(keys):
            total = totals.get(key)
            if total is None:  # a MIN/MAX's: [the extreme of the rows added, of the rows removed]
                total = totals[key] = [[None, None] if s.kind in _EXTREMES else 0 for s in self.states]
            for j, s in enumerate(self.states):
                if s.column is None:
                    total[j] += sign
                    continue
                v = values[s.column][i]
                if v is None:
                    continue
                if s.kind == "count":
                    total[j] += sign
                elif s.kind == "sum":
                    if isinstance(v, bool) or not isinstance(v, (int, decimal.Decimal)):
                        return False
                    total[j] += sign * v
                else:
                    side = 0 if sign > 0 else 1
                    best = total[j][side]
                    total[j][side] = v if best is None else _EXTREMES[s.kind](best, v)
        return True

    def _apply(self, kept: pa.RecordBatch, delta: dict[tuple[Any, ...], list[Any]]) -> pa.RecordBatch | None:
        """``kept`` with each changed group's states moved by its ``delta``: groups left with no
        rows go, groups it did not have come after its own."""
        schema, width = kept.schema, len(self.groups)
        keys = list(delta)
        found = self._rows_of(kept, keys)
        at = {s.name: j for j, s in enumerate(self.states)}
        rows_n = at[_COUNT_ROWS]
        updated = sorted((row, key) for key, row in zip(keys, found) if row is not None)
        olds = [kept.column(width + j).take(pa.array([r for r, _ in updated], pa.int64())).to_pylist()
                for j in range(len(self.states))] if updated else []
        replaced: list[list[Any]] = [[] for _ in self.states]
        emptied: list[int] = []
        for i, (row, key) in enumerate(updated):
            total = [self._moved(s, olds[j][i], d) for j, (s, d) in enumerate(zip(self.states, delta[key]))]
            if any(t is _AGAIN for t in total):
                return None
            if width and total[rows_n] == 0:
                emptied.append(row)  # every row of the group went
            states = self._states(total, schema, at)
            if states is None:
                return None
            for j, v in enumerate(states):
                replaced[j].append(v)
        new_rows = []
        for key, row in zip(keys, found):
            if row is None:
                total = [self._moved(s, None, d) for s, d in zip(self.states, delta[key])]
                if any(t is _AGAIN for t in total):
                    return None
                if width and total[rows_n] == 0:
                    continue  # came and went between the two results
                if width and total[rows_n] < 0 or not width:
                    return None  # a group the result did not have lost rows: not the result of these rows
                states = self._states(total, schema, at)
                if states is None:
                    return None
                new_rows.append((*key, *states))
        columns = list(kept.columns)
        if updated:
            mask = np.zeros(kept.num_rows, np.bool_)
            mask[[r for r, _ in updated]] = True
            where = pa.array(mask)
            for j, values in enumerate(replaced):
                columns[width + j] = pc.replace_with_mask(columns[width + j], where, pa.array(values, schema.field(width + j).type))
        result = pa.RecordBatch.from_arrays(columns, schema=schema)
        if emptied:
            keep = np.ones(kept.num_rows, np.bool_)
            keep[emptied] = False
            result = result.filter(pa.array(keep))
        if new_rows:
            more = pa.RecordBatch.from_arrays([pa.array(list(c), f.type) for c, f in zip(zip(*new_rows), schema)], schema=schema)
            result = pa.Table.from_batches([result, more]).combine_chunks().to_batches()[0]
        return result

    def _rows_of(self, kept: pa.RecordBatch, keys: list[tuple[Any, ...]]) -> list[int | None]:
        """The row of ``kept`` holding each group key, None where it has none."""
        width = len(self.groups)
        if not width:
            return [0 for _ in keys] if kept.num_rows == 1 else [None for _ in keys]
        if width == 1:  # Arrow's hash lookup; NULL finds NULL, as DuckDB groups them
            column = kept.column(0)
            return pc.index_in(pa.array([k[0] for k in keys], column.type), value_set=column).to_pylist()
        rows = {key: i for i, key in enumerate(zip(*(kept.column(i).to_pylist() for i in range(width))))}
        return [rows.get(k) for k in keys]

    @staticmethod
    def _moved(s: State, old: Any, d: Any) -> Any:
        """A state's value ``old`` (None: NULL, or no such group) moved by its delta ``d``;
        _AGAIN when a MIN/MAX lost a row that may have held it."""
        if s.kind not in _EXTREMES:
            return (old or 0) + d
        added, removed = d
        if removed is not None and (old is None or _EXTREMES[s.kind](removed, old) == removed):
            return _AGAIN  # the extreme itself (or a value at least as far) went: compute again
        if added is None:
            return old
        return added if old is None else _EXTREMES[s.kind](old, added)

    def _states(self, total: list[Any], schema: pa.Schema, at: dict[str, int]) -> list[Any] | None:
        """The output values of a group's totals; None when a sum leaves its type's range."""
        width, out = len(self.groups), []
        for j, s in enumerate(self.states):
            v = total[j]
            if s.kind == "sum":
                if total[at[s.nonnull]] == 0:  # type: ignore[index]
                    v = None
                elif abs(v) >= decimal.Decimal(10) ** (_PRECISION - schema.field(width + j).type.scale):
                    return None
                else:
                    v = decimal.Decimal(v)
            elif s.kind in _EXTREMES and total[at[s.nonnull]] == 0:  # type: ignore[index]
                v = None
            out.append(v)
        return out


def _exact(t: pa.DataType) -> bool:
    return pa.types.is_decimal(t) and t.precision == _PRECISION  # DuckDB's sums of integers and decimals


def _ordered(t: pa.DataType) -> bool:
    """Types whose Python values order as DuckDB orders them (strings by code point, which is
    UTF-8's byte order; not floats, whose NaN DuckDB puts last)."""
    return (pa.types.is_integer(t) or pa.types.is_decimal(t) or pa.types.is_string(t) or pa.types.is_large_string(t)
            or pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_boolean(t)
            or pa.types.is_date(t) or pa.types.is_timestamp(t) or pa.types.is_time(t))


def _unhashable(t: pa.DataType) -> bool:
    """Group keys whose Python values do not group as DuckDB's do (NaN, -0.0) or at all (lists)."""
    return pa.types.is_floating(t) or pa.types.is_nested(t) or pa.types.is_dictionary(t)


def _plain(node: exp.Expression | None) -> str | None:
    return node.name if isinstance(node, exp.Column) and not node.table else None


@functools.lru_cache(maxsize=256)
def maintained(sql: str) -> Maintained | None:
    """The followable form of an owner's statement, or None when it is not a partial
    aggregate of COUNTs, SUMs, MINs and MAXes of plain columns, without WHERE."""
    try:
        tree = sqlglot.parse_one(sql, dialect="duckdb")
    except sqlglot.errors.ParseError:
        return None
    if not isinstance(tree, exp.Select) or any(tree.args.get(a) for a in (
            "joins", "where", "having", "order", "limit", "offset", "distinct", "qualify", "with", "windows")):
        return None
    source = tree.args.get("from_") or tree.args.get("from")
    if source is None or not isinstance(source.this, exp.Table) or source.this.name != ROWS:
        return None
    groups: list[tuple[str, str]] = []
    states: list[State] = []
    sums: list[str] = []
    for item in tree.expressions:
        if not isinstance(item, exp.Alias):
            return None
        name, value = item.alias, item.this
        column = _plain(value.this) if isinstance(value, (exp.Count, exp.Sum, exp.Min, exp.Max)) else None
        if name.startswith("__g") and _plain(value) is not None and not states:
            groups.append((name, _plain(value)))  # type: ignore[arg-type]
        elif isinstance(value, exp.Count) and (isinstance(value.this, exp.Star) or column is not None):
            states.append(State(name, "count", column))
        elif isinstance(value, (exp.Sum, exp.Min, exp.Max)) and column is not None and not value.expressions:
            sums.append(column)
            kind = "sum" if isinstance(value, exp.Sum) else "min" if isinstance(value, exp.Min) else "max"
            states.append(State(name, kind, column, f"__n{len(sums) - 1}"))
        else:
            return None
    group = tree.args.get("group")
    if [g.name if isinstance(g, exp.Column) else None for g in (group.expressions if group else [])] != \
            [c for _, c in groups]:
        return None
    hidden = tree.copy()
    hidden.append("expressions", exp.alias_(exp.Count(this=exp.Star()), _COUNT_ROWS, quoted=True))
    states.append(State(_COUNT_ROWS, "count", None))
    for i, column in enumerate(sums):
        hidden.append("expressions", exp.alias_(exp.Count(this=exp.column(column, quoted=True)), f"__n{i}", quoted=True))
        states.append(State(f"__n{i}", "count", column))
    return Maintained(hidden.sql(dialect="duckdb"), len(tree.expressions), tuple(groups), tuple(states))
