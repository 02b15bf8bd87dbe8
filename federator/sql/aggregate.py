"""Two-phase GROUP BY: each partition reduces its rows to partial states (`partial`), and the
receiving node merges the states of all partitions into the answer (`final`).

States are chosen so merging is exact and matches DuckDB: integer sums are carried as
DECIMAL(38,0) (Arrow's int64 sum wraps silently; DuckDB sums into HUGEINT), AVG as sum and
count, COUNT(DISTINCT x) as the list of distinct values each partition saw (deduplicated again
at the merge), and MIN/MAX over DOUBLE with a "saw NaN" flag because Arrow skips NaN where
DuckDB orders it above every number. Float group keys and distinct values are normalized to
one NaN and one zero so grouping sees DuckDB's equality. NULL keys form their own group.
"""

from __future__ import annotations

import dataclasses

import decimal
from dataclasses import dataclass
from typing import Any, Sequence

import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from federator.sql.errors import SqlError, unsupported
from federator.sql.evaluate import (
    DATA_ERROR_CODE,
    Compiled,
    _kind,
    _normalize_float,
    compile_expr,
    default_name,
    sql_type_name,
)

__all__ = ["AggSpec", "agg_spec", "partial", "final"]

_FUNCS = ("COUNT", "SUM", "MIN", "MAX", "AVG")
_WIDE = pa.decimal128(38, 0)  # exact integer sums, like DuckDB's HUGEINT
_ORDERED = {"int", "float", "string", "bool", "timestamp", "date", "binary"}


@dataclass(frozen=True)
class AggSpec:
    """One aggregate: func is COUNT, SUM, MIN, MAX or AVG; arg None means COUNT(*)."""

    func: str
    arg: Compiled | None
    distinct: bool = False
    name: str = ""

    def __post_init__(self) -> None:
        func = self.func.upper()
        object.__setattr__(self, "func", func)
        if func not in _FUNCS:
            raise unsupported(f"aggregate {self.func}", f"supported: {', '.join(_FUNCS)}")
        if self.arg is None:
            if func != "COUNT" or self.distinct:
                raise unsupported(f"{func}({'DISTINCT ' if self.distinct else ''}*)")
            return
        if self.distinct and pa.types.is_null(self.arg.type):
            # pyarrow's hash "distinct" kernel segfaults on a null-typed column (COUNT(DISTINCT
            # NULL) GROUP BY took nodes down): the same nulls typed int8 give the same answer.
            object.__setattr__(self, "arg", dataclasses.replace(self.arg, type=pa.int8()))
        k = _kind(self.arg.type)
        if func in ("SUM", "AVG") and k not in ("int", "float", "null"):
            raise unsupported(f"{func}({self.arg.sql}) over {sql_type_name(self.arg.type)}", "it needs a number")
        if func in ("MIN", "MAX") and k not in _ORDERED | {"null"}:
            raise unsupported(f"{func}({self.arg.sql}) over {sql_type_name(self.arg.type)}")

    @property
    def type(self) -> pa.DataType:
        """Result type: COUNT BIGINT, SUM BIGINT or DOUBLE (DuckDB: HUGEINT for integers, same
        values), AVG DOUBLE, MIN/MAX the argument's type."""
        if self.func == "COUNT":
            return pa.int64()
        if self.func == "AVG":
            return pa.float64()
        if self.func == "SUM":
            return pa.float64() if _kind(self.arg.type) == "float" else pa.int64()
        return self.arg.type

    @property
    def _exact_int(self) -> bool:
        return self.arg is not None and _kind(self.arg.type) in ("int", "null")

    @property
    def _by_values(self) -> bool:
        """COUNT/SUM/AVG(DISTINCT x) need the values; MIN/MAX(DISTINCT x) equal MIN/MAX(x)."""
        return self.distinct and self.func in ("COUNT", "SUM", "AVG")


def agg_spec(
    node: exp.Expression, schema: pa.Schema, params: Sequence[Any] = (), name: str | None = None
) -> AggSpec:
    """An AggSpec from a parsed COUNT/SUM/MIN/MAX/AVG call (aliased or not)."""
    out_name = name or default_name(node)
    call = node.this if isinstance(node, exp.Alias) else node
    funcs = {exp.Count: "COUNT", exp.Sum: "SUM", exp.Min: "MIN", exp.Max: "MAX", exp.Avg: "AVG"}
    func = funcs.get(type(call))
    if func is None:
        raise unsupported(f"aggregate {call.sql(dialect='duckdb')}", f"supported: {', '.join(_FUNCS)}")
    target, distinct = call.this, False
    if isinstance(target, exp.Distinct):
        if len(target.expressions) != 1:
            raise unsupported(call.sql(dialect="duckdb"), "DISTINCT takes one expression here")
        target, distinct = target.expressions[0], True
    if isinstance(target, exp.Star) or target is None:
        return AggSpec(func, None, distinct, out_name)
    return AggSpec(func, compile_expr(target, schema, params), distinct, out_name)


# --------------------------------------------------------------------------- states


def _state_fields(i: int, spec: AggSpec) -> list[pa.Field]:
    p = f"__a{i}_"
    if spec.arg is None:
        return [pa.field(p + "count", pa.int64())]
    if spec._by_values:
        return [pa.field(p + "distinct", pa.list_(spec.arg.type))]
    t = spec.arg.type
    if spec.func == "COUNT":
        return [pa.field(p + "count", pa.int64())]
    sum_type = _WIDE if spec._exact_int else pa.float64()
    if spec.func == "SUM":
        return [pa.field(p + "sum", sum_type)]
    if spec.func == "AVG":
        return [pa.field(p + "sum", sum_type), pa.field(p + "count", pa.int64())]
    op = spec.func.lower()
    fields = [pa.field(p + op, t)]
    if _kind(t) == "float":
        fields.append(pa.field(p + "nan", pa.bool_()))
    return fields


def _key_array(key: Compiled, table: pa.Table | pa.RecordBatch) -> pa.Array:
    a = key(table)
    return _normalize_float(a) if _kind(a.type) == "float" else a


def partial(
    table: pa.Table | pa.RecordBatch,
    group_keys: list[Compiled],
    aggs: list[AggSpec],
    key_names: Sequence[str] | None = None,
) -> pa.Table:
    """One partition's partial states: key columns (named `key_names`, default k0, k1, ...)
    then `__a{i}_*` state columns, one row per group present in `table`."""
    names = list(key_names) if key_names is not None else [f"k{j}" for j in range(len(group_keys))]
    if len(names) != len(group_keys):
        raise ValueError("one name per group key")
    n = table.num_rows
    if not group_keys:
        return _partial_ungrouped(table, aggs)
    cols: dict[str, pa.Array] = {f"__k{j}": _key_array(k, table) for j, k in enumerate(group_keys)}
    if not group_keys:
        cols["__k"] = pa.repeat(pa.scalar(True), n)  # one constant key: every row in one group
    plan: list[tuple[str, str, Any]] = []  # (input column, Arrow hash aggregation, options)
    out: list[tuple[str, str]] = []  # (state column, Arrow output column)
    for i, spec in enumerate(aggs):
        src, fields = f"__a{i}", _state_fields(i, spec)
        if spec.arg is None:
            cols[src] = pa.repeat(pa.scalar(True), n)
            plan.append((src, "count", pc.CountOptions(mode="all")))
            out.append((fields[0].name, f"{src}_count"))
            continue
        v = spec.arg(table)
        if spec._by_values:
            cols[src] = _normalize_float(v) if _kind(v.type) == "float" else v
            plan.append((src, "distinct", pc.CountOptions(mode="only_valid")))
            out.append((fields[0].name, f"{src}_distinct"))
            continue
        if spec.func == "COUNT":
            cols[src] = v
            plan.append((src, "count", pc.CountOptions(mode="only_valid")))
            out.append((fields[0].name, f"{src}_count"))
        elif spec.func in ("SUM", "AVG"):
            cols[src] = v.cast(fields[0].type)
            plan.append((src, "sum", pc.ScalarAggregateOptions(min_count=1)))
            out.append((fields[0].name, f"{src}_sum"))
            if spec.func == "AVG":
                plan.append((src, "count", pc.CountOptions(mode="only_valid")))
                out.append((fields[1].name, f"{src}_count"))
        else:
            op = spec.func.lower()
            cols[src] = v
            plan.append((src, op, None))
            out.append((fields[0].name, f"{src}_{op}"))
            if len(fields) > 1:
                cols[src + "n"] = pc.fill_null(pc.is_nan(v), False)
                plan.append((src + "n", "any", None))
                out.append((fields[1].name, f"{src}n_any"))
    key_cols = [c for c in cols if c.startswith("__k")]
    work = pa.table(cols)
    grouped = work.group_by(key_cols, use_threads=False).aggregate(
        [(src, fn) if opts is None else (src, fn, opts) for src, fn, opts in plan]
    )
    arrays = [grouped[f"__k{j}"] for j in range(len(group_keys))] + [grouped[o] for _, o in out]
    schema = _state_schema([pa.field(nm, k.type) for nm, k in zip(names, group_keys)], aggs)
    return pa.Table.from_arrays([a.cast(f.type) for a, f in zip(arrays, schema)], schema=schema)


def _partial_ungrouped(table: pa.Table | pa.RecordBatch, aggs: list[AggSpec]) -> pa.Table:
    """The same states for one group of every row, with Arrow's scalar kernels: a hash
    aggregation over a constant key (and a wide cast for exact sums) costs far more."""
    schema = _state_schema([], aggs)
    n = table.num_rows
    if n == 0:
        return schema.empty_table()
    values: list[Any] = []
    for spec in aggs:
        if spec.arg is None:
            values.append(n)
            continue
        v = spec.arg(table)
        if spec._by_values:
            values.append(pc.unique(_normalize_float(v) if _kind(v.type) == "float" else v).drop_null())
            continue
        if spec.func == "COUNT":
            values.append(pc.count(v, mode="only_valid").as_py())
        elif spec.func in ("SUM", "AVG"):
            values.append(_exact_sum(v) if spec._exact_int else pc.sum(v.cast(pa.float64()), min_count=1).as_py())
            if spec.func == "AVG":
                values.append(pc.count(v, mode="only_valid").as_py())
        else:
            values.append(pc.min(v).as_py() if spec.func == "MIN" else pc.max(v).as_py())
            if _kind(v.type) == "float":
                values.append(pc.any(pc.fill_null(pc.is_nan(v), False)).as_py())
    arrays = []
    for value, f in zip(values, schema):
        if isinstance(value, (pa.Array, pa.ChunkedArray)):
            arrays.append(pa.array([value.to_pylist()], f.type))
        else:
            arrays.append(pa.array([value], f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def _exact_sum(v: pa.Array | pa.ChunkedArray) -> int | None:
    """An integer column's sum, exactly: in int64 when it cannot overflow, else wide."""
    if len(v) <= 16:  # a few rows (a write's delta): Python's ints are exact and cheaper than kernels
        values = [x for x in v.to_pylist() if x is not None]
        return sum(values) if values else None
    if pc.count(v, mode="only_valid").as_py() == 0:
        return None
    bounds = pc.min_max(v)
    lo, hi = bounds["min"].as_py(), bounds["max"].as_py()
    if max(abs(lo), abs(hi)) * len(v) < 2**63:
        return pc.sum(v.cast(pa.int64())).as_py()
    return pc.sum(v.cast(_WIDE)).as_py()


# --------------------------------------------------------------------------- merge


def _state_schema(key_fields: list[pa.Field], aggs: list[AggSpec]) -> pa.Schema:
    return pa.schema(key_fields + [f for i, s in enumerate(aggs) for f in _state_fields(i, s)])


def final(partials: list[pa.Table], n_keys: int, aggs: list[AggSpec]) -> pa.Table:
    """Merge partial states into the result: the key columns (named as in the partials), then
    one column per aggregate named by its spec. Without keys there is exactly one row."""
    if partials:
        schema = partials[0].schema
        key_fields = [schema.field(j) for j in range(n_keys)]
    else:
        key_fields = [pa.field(f"k{j}", pa.null()) for j in range(n_keys)]
    schema = _state_schema(key_fields, aggs)
    states = pa.concat_tables([p.select(schema.names).cast(schema) for p in partials] or [schema.empty_table()])
    keys = {f"__k{j}": states.column(j) for j in range(n_keys)}
    if not n_keys:
        keys["__k"] = pa.repeat(pa.scalar(True), states.num_rows)

    # Distinct values travel as lists; explode them into rows of (keys, value), dedupe per
    # group, and append those rows to the states so one group_by merges everything.
    value_cols = {i: f"__v{i}" for i, s in enumerate(aggs) if s._by_values}
    # values summed for SUM/AVG(DISTINCT) go wide, as integer sums do
    value_types = {i: _WIDE if aggs[i]._exact_int and aggs[i].func != "COUNT" else aggs[i].arg.type for i in value_cols}
    base = dict(keys)
    base.update({name: states.column(name) for name in schema.names[n_keys:]})
    base.update({value_cols[i]: pa.nulls(states.num_rows, value_types[i]) for i in value_cols})
    parts = [pa.table(base)]
    for i, col in value_cols.items():
        lists = states.column(f"__a{i}_distinct").combine_chunks()
        parents = pc.list_parent_indices(lists)
        exploded = {k: v.take(parents) for k, v in keys.items()}
        exploded[col] = pc.list_flatten(lists)
        unique = pa.table(exploded).group_by(list(exploded), use_threads=False).aggregate([])
        m = unique.num_rows
        extra = {k: unique[k] for k in keys}
        extra.update({name: pa.nulls(m, schema.field(name).type) for name in schema.names[n_keys:]})
        extra.update({c: pa.nulls(m, value_types[j]) for j, c in value_cols.items()})
        extra[col] = unique[col].cast(value_types[i])
        parts.append(pa.table(extra).select(parts[0].column_names))
    union = pa.concat_tables(parts)

    plan: list[tuple[str, str]] = []
    for i, spec in enumerate(aggs):
        p = f"__a{i}_"
        if spec._by_values:
            plan.append((value_cols[i], "count"))
            if spec.func != "COUNT":
                plan.append((value_cols[i], "sum"))
        elif spec.func in ("COUNT",):
            plan.append((p + "count", "sum"))
        elif spec.func in ("SUM", "AVG"):
            plan.append((p + "sum", "sum"))
            if spec.func == "AVG":
                plan.append((p + "count", "sum"))
        else:
            plan.append((p + spec.func.lower(), spec.func.lower()))
            if _kind(spec.arg.type) == "float":
                plan.append((p + "nan", "any"))
    if not n_keys and not value_cols and union.num_rows:
        # one group: Arrow's scalar kernels, with the hash kernels' defaults (skip nulls, NULL
        # when there is no value), cost a fraction of a hash aggregation
        scalar = {"sum": pc.sum, "min": pc.min, "max": pc.max, "any": pc.any}
        grouped = pa.table({f"{c}_{fn}": pa.repeat(scalar[fn](union[c]), 1) for c, fn in plan})
    else:
        grouped = union.group_by(list(keys), use_threads=False).aggregate(plan)
    if not n_keys and grouped.num_rows == 0:
        # no rows at all: SQL still answers one row (COUNT 0, everything else NULL)
        grouped = pa.table(
            {f"{c}_{fn}": pa.nulls(1, pa.int64() if fn == "count" else union.schema.field(c).type) for c, fn in plan}
        )

    out_cols = [grouped[f"__k{j}"] for j in range(n_keys)]
    for i, spec in enumerate(aggs):
        out_cols.append(_finish(i, spec, grouped, value_cols.get(i)))
    names = [f.name for f in key_fields] + [s.name or f"a{i}" for i, s in enumerate(aggs)]
    types = [f.type for f in key_fields] + [s.type for s in aggs]
    return pa.Table.from_arrays([c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in out_cols],
                                schema=pa.schema([pa.field(n, t) for n, t in zip(names, types)]))


def _col(grouped: pa.Table, name: str) -> pa.Array:
    c = grouped[name]
    return c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c


def _finish(i: int, spec: AggSpec, g: pa.Table, value_col: str | None) -> pa.Array:
    p = f"__a{i}_"
    if value_col is not None:
        count = pc.fill_null(_col(g, f"{value_col}_count"), 0)
        if spec.func == "COUNT":
            return count
        total = _col(g, f"{value_col}_sum")
    elif spec.func == "COUNT":
        return pc.fill_null(_col(g, p + "count_sum"), 0)
    else:
        total = _col(g, p + "sum_sum") if spec.func in ("SUM", "AVG") else None
        count = pc.fill_null(_col(g, p + "count_sum"), 0) if spec.func == "AVG" else None
    if spec.func == "SUM":
        if spec.type == pa.int64():
            lo, hi = (pa.scalar(decimal.Decimal(b), total.type) for b in (-(2**63), 2**63 - 1))
            over = pc.or_(pc.greater(total, hi), pc.less(total, lo))
            if pc.any(pc.fill_null(over, False)).as_py():
                raise SqlError(DATA_ERROR_CODE, f"SUM({spec.arg.sql}) is outside BIGINT range")
        return total.cast(spec.type)
    if spec.func == "AVG":
        mean = pc.divide(total.cast(pa.float64()), count.cast(pa.float64()))
        return pc.if_else(pc.equal(count, 0), pa.scalar(None, pa.float64()), mean)
    op = spec.func.lower()
    best = _col(g, f"{p}{op}_{op}").cast(spec.type)
    if _kind(spec.type) != "float":
        return best
    saw_nan = pc.fill_null(_col(g, p + "nan_any"), False)
    nan = pa.scalar(float("nan"), spec.type)
    if op == "max":  # NaN is the largest DOUBLE in DuckDB
        return pc.if_else(saw_nan, nan, best)
    return pc.if_else(pc.and_(pc.is_null(best), saw_nan), nan, best)  # MIN is NaN only if all were NaN

