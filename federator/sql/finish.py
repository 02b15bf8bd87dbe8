"""The receiver's last step in Arrow, for the two shapes where a DuckDB statement costs more
than the work: merging the owners' partial aggregates (COUNT/SUM/MIN/MAX states, grouped or
not) and cutting the owners' top rows (ORDER BY columns LIMIT n). A DuckDB statement
over a few registered rows costs about a millisecond whatever it does; these cost tens of
microseconds.

Each finish answers exactly what DuckDB would, or None, and the receiver then runs the
statement in DuckDB as usual: only types whose order and arithmetic are the same here
(integers, decimals, strings, booleans, dates and times; never floats, whose sums depend on
their order and whose NaN sorts differently) are finished here, and a value out of the
answer type's range goes to DuckDB, which raises its own error.
"""

from __future__ import annotations

import decimal
import functools
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Callable

import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from federator.memo import by_identity
from federator.query.rows import Rows

# Types compared and added alike in Python/Arrow and DuckDB, with the Arrow type DuckDB
# answers with for each (None: the same type).
_EXACT = (pa.types.is_integer, pa.types.is_decimal, pa.types.is_boolean, pa.types.is_date,
          pa.types.is_timestamp, pa.types.is_time)
_STRINGS = {pa.large_string(): pa.string(), pa.string(): pa.string(), pa.large_binary(): pa.binary(),
            pa.binary(): pa.binary()}


def _exact(t: pa.DataType) -> bool:
    return t in _STRINGS or any(test(t) for test in _EXACT)


def _as_duckdb(t: pa.DataType) -> pa.DataType | None:
    """The Arrow type DuckDB answers a column of ``t`` with, where it is sure (times and
    timestamps come back in other units or zones)."""
    if t in _STRINGS:
        return _STRINGS[t]
    if pa.types.is_integer(t) or pa.types.is_decimal(t) or pa.types.is_boolean(t) or t == pa.date32():
        return t
    return None


@functools.lru_cache(maxsize=256)
def _duckdb_schema(schema: pa.Schema) -> pa.Schema | None:
    """The schema DuckDB answers columns of ``schema`` with, where it is sure of every type."""
    types = [_as_duckdb(f.type) for f in schema]
    if any(t is None for t in types):
        return None
    return pa.schema([pa.field(f.name, t) for f, t in zip(schema, types)])


@dataclass(frozen=True)
class TopRows:
    """``SELECT <columns> FROM <rows> [ORDER BY <columns>] [LIMIT n [OFFSET m]]``.
    ``columns``: (column of the rows, output name); ``order``: (column, descending, nulls
    first)."""

    columns: tuple[tuple[str, str], ...] | None  # None: every column (SELECT *)
    order: tuple[tuple[str, bool, bool], ...]
    limit: int | None
    offset: int

    def apply(self, rows: pa.Table | Rows, schema: pa.Schema | None) -> pa.Table | Rows | None:
        if isinstance(rows, Rows):  # a few rows as Python values: cut in Python, where the types allow
            cut = self._apply_rows(rows, schema)
            return cut if cut is not None else self.apply(rows.to_table(), schema)
        names = rows.column_names
        columns = self.columns if self.columns is not None else tuple((n, n) for n in names)
        if any(c not in names for c, _ in columns) or any(c not in names for c, _, _ in self.order):
            return None
        if any(not _exact(rows.schema.field(c).type) for c, _, _ in self.order):
            return None
        if self.order:
            indices = _sort_indices(rows, self.order)
            if indices is None:
                return None
            stop = None if self.limit is None else self.offset + self.limit
            rows = rows.take(indices[self.offset:stop])
        elif self.offset or self.limit is not None:
            rows = rows.slice(self.offset, self.limit)
        # the names DuckDB gives the columns where it was asked (``+ x`` is not ``x``)
        names = schema.names if schema is not None and len(schema) == len(columns) else [n for _, n in columns]
        table = rows.select([c for c, _ in columns]).rename_columns(names)
        if schema is None:  # a rule's rows: no answer schema was planned
            schema = _duckdb_schema(table.schema)
            if schema is None:
                return None
        if table.schema.equals(schema):
            return table  # a cast to the same types still costs a pass over every column
        try:
            return table.cast(schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None


    def _apply_rows(self, rows: Rows, schema: pa.Schema | None) -> Rows | None:
        """``apply`` over Python values, the same answer: a stable sort per key (the last key
        first), each key's nulls first or last; None when the rows' types are not the answer's
        (a cast is Arrow's) or a column is missing."""
        layout = _rows_layout(self, rows.schema, schema)
        if layout is None:
            return None
        sort_keys, pick, out = layout
        kept = rows.rows
        for i, desc, nulls_first in sort_keys:
            kept = _sorted(kept, i, desc, nulls_first)
        stop = None if self.limit is None else self.offset + self.limit
        kept = kept[self.offset:stop]
        return Rows(out, kept if pick is None else list(map(pick, kept)))


@by_identity
def _rows_layout(top: TopRows, source: pa.Schema, schema: pa.Schema | None
                 ) -> tuple[list[tuple[int, bool, bool]], Callable[[tuple], tuple] | None, pa.Schema] | None:
    """For ``TopRows._apply_rows``, made once per statement and schema (a schema costs more to
    build than a row to cut): the sort keys as column indices (the last key first), what picks
    the columns of a row (None: every column, in order), and the answer's schema; None where
    Arrow must answer."""
    names = source.names
    columns = top.columns if top.columns is not None else tuple((n, n) for n in names)
    if any(c not in names for c, _ in columns) or any(c not in names for c, _, _ in top.order) \
            or any(not _exact(source.field(c).type) for c, _, _ in top.order):
        return None
    at = [names.index(c) for c, _ in columns]
    out_names = schema.names if schema is not None and len(schema) == len(columns) else [n for _, n in columns]
    picked = pa.schema([source.field(i).with_name(n) for i, n in zip(at, out_names)])
    out = schema if schema is not None else _duckdb_schema(picked)
    if out is None or out.types != picked.types:
        return None
    sort_keys = [(names.index(c), desc, first) for c, desc, first in reversed(top.order)]
    return sort_keys, _picker(at, len(names)), out


def _picker(at: list[int], width: int) -> Callable[[tuple], tuple] | None:
    """What picks the columns ``at`` of a row of ``width`` as a tuple, in C; None when that is
    the whole row (a rank's answer keeps every column of its rule's rows)."""
    if at == list(range(width)):
        return None
    if len(at) == 1:
        return lambda row: (row[at[0]],)
    return itemgetter(*at)


def _sorted(rows: list[tuple], i: int, descending: bool, nulls_first: bool) -> list[tuple]:
    """``rows`` ordered by column ``i`` as ``pc.sort_indices`` orders them (stable)."""
    nulls = [r for r in rows if r[i] is None]
    values = sorted((r for r in rows if r[i] is not None), key=itemgetter(i), reverse=descending)
    return nulls + values if nulls_first else values + nulls


@dataclass(frozen=True)
class MergeStates:
    """``SELECT <group keys and merges> FROM <states> [GROUP BY __g...] [ORDER BY outputs]
    [LIMIT n [OFFSET m]]``: the owners' states merged per group (one group without GROUP BY),
    in Python (exact). ``items``: (output name, "key" or count|sum|min|max, column of the
    states); ``keys``: the group columns; ``order``: (output name or group column, descending,
    nulls first)."""

    items: tuple[tuple[str, str, str], ...]
    keys: tuple[str, ...] = ()
    order: tuple[tuple[str, bool, bool], ...] = ()
    limit: int | None = None
    offset: int = 0

    def apply(self, states: pa.Table, schema: pa.Schema | None) -> pa.Table | None:
        if schema is None or len(schema) != len(self.items):
            return None
        needed = set(self.keys) | {c for _, _, c in self.items}
        if not needed <= set(states.column_names) or \
                not all(_exact(states.schema.field(c).type) for c in needed) or not all(_exact(t) for t in schema.types):
            return None  # a float key (NaN, -0.0) or state: DuckDB's equality and sums
        merged = [item for item in self.items if item[1] != "key"]  # (output, op, state column)
        # without GROUP BY there is one answer row, even over no states (COUNT 0, SUM NULL)
        groups: dict[tuple, list[list]] = {} if self.keys else {(): [[] for _ in merged]}
        key_columns = [states.column(k).to_pylist() for k in self.keys]
        state_columns = [states.column(c).to_pylist() for _, _, c in merged]
        for i, key in enumerate(zip(*key_columns) if self.keys else [()] * states.num_rows):
            bucket = groups.get(key)
            if bucket is None:
                bucket = groups[key] = [[] for _ in merged]
            for values, column in zip(bucket, state_columns):
                if column[i] is not None:
                    values.append(column[i])
        out: dict[str, list] = {k: [] for k in self.keys}
        for name, _, _ in self.items:
            out.setdefault(name, [])
        for key, bucket in groups.items():
            for k, v in zip(self.keys, key):
                out[k].append(v)
            for (name, op, _), values in zip(merged, bucket):
                value = _merge(op, values)
                if value is _DECLINE:
                    return None
                out[name].append(value)
        for name, op, column in self.items:
            if op == "key" and name != column:
                out[name] = out[column]
        types = {**{k: states.schema.field(k).type for k in self.keys}, **dict(zip(schema.names, schema.types))}
        try:  # a value out of its type's range (a sum past 38 digits): DuckDB says so
            table = pa.table({n: pa.array(v, types[n]) for n, v in out.items()})
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
            return None
        if self.order:
            indices = _sort_indices(table, self.order)
            if indices is None:
                return None
            table = table.take(indices)
        if self.offset or self.limit is not None:
            table = table.slice(self.offset, self.limit)
        return table.select(schema.names).cast(schema)


_DECLINE = object()


def _merge(op: str, values: list) -> Any:
    """One group's (or the whole answer's) merged state; _DECLINE where DuckDB must do it."""
    if op in ("count", "sum") and not all(type(v) is int or isinstance(v, decimal.Decimal) for v in values):
        return _DECLINE
    if op == "count":
        return sum(values)
    if not values:
        return None
    if op == "sum":
        with decimal.localcontext(prec=_DIGITS):  # exact: 38 digits, and more to see an overflow
            return sum(values)
    return min(values) if op == "min" else max(values)


def merge_states(select: exp.Expression, relation: str) -> MergeStates | None:
    """The receiver's statement over the owners' partial states (pushdown.partial_aggregate's
    ``final``) as a MergeStates, or None when it does anything else (HAVING, expressions over
    the merges, AVG, ...)."""
    if _only_from(select, relation, allowed=("group",)) is None:
        return None
    group = select.args.get("group")
    if group is not None and any(group.args.get(a) for a in ("all", "rollup", "cube", "grouping_sets")):
        return None
    keys = []
    for g in group.expressions if group is not None else []:
        name = _state_column(g, "__g")
        if name is None:
            return None
        keys.append(name)
    items: list[tuple[str, str, str]] = []
    for item in select.expressions:
        if not isinstance(item, exp.Alias):
            return None
        merged = _merged_state(item.this)
        if merged is None:
            return None
        items.append((item.alias, *merged))
    if any(op == "key" and column not in keys for _, op, column in items):
        return None
    names = [n for n, _, _ in items]
    if len(set(names)) != len(names) or set(names) & (set(keys) - {c for n, op, c in items if n == c}):
        return None
    order: list[tuple[str, bool, bool]] = []
    ordered = select.args.get("order")
    for o in ordered.expressions if ordered is not None else []:
        col = o.this
        if not isinstance(col, exp.Column) or col.table or not isinstance(col.this, exp.Identifier):
            return None
        if col.name not in names and col.name not in keys:
            return None
        order.append((col.name, bool(o.args.get("desc")), bool(o.args.get("nulls_first"))))
    limit, offset = _count(select.args.get("limit")), _count(select.args.get("offset"))
    if limit is False or offset is False:
        return None
    return MergeStates(tuple(items), tuple(keys), tuple(order), limit, offset or 0)


def _state_column(node: exp.Expression, prefix: str) -> str | None:
    if isinstance(node, exp.Column) and not node.table and isinstance(node.this, exp.Identifier) and \
            node.name.startswith(prefix):
        return node.name
    return None


def _merged_state(node: exp.Expression) -> tuple[str, str] | None:
    """(op, column) for a group key or the planner's merge of one state (pushdown.partial_aggregate)."""
    key = _state_column(node, "__g")
    if key is not None:
        return "key", key
    if isinstance(node, exp.Cast) and node.to.this == exp.DataType.Type.BIGINT and isinstance(node.this, exp.Coalesce):
        inner, rest = node.this.this, node.this.expressions
        if isinstance(inner, exp.Sum) and len(rest) == 1 and isinstance(rest[0], exp.Literal) and rest[0].this == "0":
            state = _state_column(inner.this, "__a")
            return ("count", state) if state is not None else None
    for cls, op in ((exp.Sum, "sum"), (exp.Min, "min"), (exp.Max, "max")):
        if type(node) is cls:
            state = _state_column(node.this, "__a")
            return (op, state) if state is not None else None
    return None


_DIGITS = 80


def _sort_indices(rows: pa.Table, order: tuple[tuple[str, bool, bool], ...]) -> pa.Array | None:
    """The rows' order (stable), each key's nulls first or last; None where this pyarrow places
    the nulls of every key alike and the keys differ."""
    keys = [(c, "descending" if desc else "ascending") for c, desc, _ in order]
    placements = ["at_start" if first else "at_end" for _, _, first in order]
    if _PER_KEY_NULLS:
        return pc.sort_indices(rows, sort_keys=[(c, o, p) for (c, o), p in zip(keys, placements)])
    if len(set(placements)) > 1:
        return None
    return pc.sort_indices(rows, sort_keys=keys, null_placement=placements[0])


def _per_key_nulls() -> bool:
    try:
        pc.sort_indices(pa.table({"a": [1]}), sort_keys=[("a", "ascending", "at_end")])
        return True
    except (TypeError, ValueError, pa.ArrowInvalid):
        return False


_PER_KEY_NULLS = _per_key_nulls()

Finish = MergeStates | TopRows


def top_rows(select: exp.Expression, relation: str) -> TopRows | None:
    """``select`` as a TopRows over ``relation``, or None when it does anything else."""
    source = _only_from(select, relation)
    if source is None:
        return None
    qualifier = source.alias_or_name

    def column(node: exp.Expression) -> str | None:
        if isinstance(node, exp.Column) and isinstance(node.this, exp.Identifier) and \
                (not node.table or node.table == qualifier):
            return node.name
        return None

    columns: list[tuple[str, str]] = []
    star = len(select.expressions) == 1 and isinstance(select.expressions[0], exp.Star) and \
        not any(select.expressions[0].args.values())
    for item in [] if star else select.expressions:
        inner = item.this if isinstance(item, exp.Alias) else item
        name = column(inner)
        if name is None:
            return None
        columns.append((name, item.alias_or_name))
    source_of = {n: c for c, n in columns}
    if len(source_of) != len(columns):
        return None
    order: list[tuple[str, bool, bool]] = []
    ordered = select.args.get("order")
    for o in ordered.expressions if ordered is not None else []:
        name = column(o.this)
        if name is None:
            return None
        if not o.this.table:  # DuckDB binds a bare name to the select list's names first
            name = source_of.get(name, name)
        desc = bool(o.args.get("desc"))
        nulls_first = o.args.get("nulls_first")
        order.append((name, desc, bool(nulls_first)))
    limit = _count(select.args.get("limit"))
    offset = _count(select.args.get("offset"))
    if limit is False or offset is False:
        return None
    return TopRows(None if star else tuple(columns), tuple(order), limit, offset or 0)


_CLAUSES = ("joins", "where", "group", "having", "distinct", "qualify", "with_", "with", "windows", "sample",
            "laterals", "pivots", "prewhere", "settings")


def _only_from(select: exp.Expression, relation: str, allowed: tuple[str, ...] = ()) -> exp.Table | None:
    """The table ``select`` reads when it is a SELECT from ``relation`` alone, with none of
    the clauses a finish does not do (but ``allowed``); else None."""
    if not isinstance(select, exp.Select) or any(select.args.get(k) for k in _CLAUSES if k not in allowed):
        return None
    source = select.args.get("from_")
    if source is None or not isinstance(source.this, exp.Table) or source.this.name != relation or \
            source.this.args.get("db") or source.this.args.get("joins"):
        return None
    return source.this


def _count(clause: exp.Expression | None) -> int | None | bool:
    """A LIMIT or OFFSET's row count; None without one; False when it is not a plain count."""
    if clause is None:
        return None
    value = clause.expression if isinstance(clause, (exp.Limit, exp.Offset)) else clause
    if isinstance(value, exp.Literal) and value.is_int and int(value.this) >= 0:
        return int(value.this)
    return False
