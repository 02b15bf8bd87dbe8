"""Planning: a bound SELECT → per-partition sub-queries, what runs at the owners, what the receiver finishes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from sqlglot import exp

from federator.catalog.definition import StoreDefinition
from federator.plan.keys import SubQuery, plan_store_queries
from federator.sql.errors import SqlError, unsupported
from federator.sql.evaluate import compile_expr
from federator.sql.pipeline import OrderKey, Pipeline

AGG_FUNCS = {exp.Count: "count", exp.Sum: "sum", exp.Min: "min", exp.Max: "max", exp.Avg: "avg"}


@dataclass
class SelectPlan:
    source_schema: pa.Schema
    store: StoreDefinition | None  # None: a table Federator makes itself (information_schema)
    virtual: pa.Table | None
    subqueries: list[SubQuery]
    pipeline: Pipeline
    aggregate: bool
    n_keys: int
    aggs: list[tuple[str, str | None, bool, str]]
    outputs: list[tuple[str, exp.Expression]]  # over the merged table
    having: exp.Expression | None
    order: list[tuple[exp.Expression, bool, bool]]  # over the merged table
    offset: int
    limit: int | None
    notes: list[str] = field(default_factory=list)
    # what the receiver compiled for this plan (the engine keeps plans of repeated queries)
    compiled: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)


def bind_parameters(select: exp.Select, params: list[Any], expected: int) -> exp.Select:
    """A copy of ``select`` with each ? replaced by its parameter as a literal."""
    if len(params) != expected:
        raise SqlError(
            "INVALID_PARAMETER",
            f"the SQL has {expected} ? placeholder(s) but {len(params)} parameter(s) were given",
        )
    if not expected:
        return select
    bound = select.copy()
    for node in list(bound.find_all(exp.Placeholder, bfs=False)):
        value = params[node.meta["param_index"]]
        if value is not None and not isinstance(value, (str, int, float, bool)):
            raise SqlError(
                "INVALID_PARAMETER",
                f"parameter {node.meta['param_index'] + 1} is {type(value).__name__}; "
                "parameters are strings, numbers, booleans or null",
            )
        node.replace(exp.convert(value))
    return bound


def _check_supported(select: exp.Select) -> None:
    if select.args.get("with_") or select.args.get("with"):
        raise unsupported("WITH (common table expressions)", "query one store directly")
    if select.args.get("joins"):
        raise unsupported("JOIN", "query one store per request; joins of co-partitioned stores come later")
    for node in select.find_all(exp.Subquery, exp.Window, exp.Lateral, exp.Unnest):
        name = {exp.Subquery: "a subquery", exp.Window: "a window function (OVER)"}.get(type(node), node.key.upper())
        raise unsupported(f"{name} ({node.sql()[:60]})")
    if select.args.get("qualify"):
        raise unsupported("QUALIFY")


def _resolve_alias_or_ordinal(node: exp.Expression, outputs: list[tuple[str, exp.Expression]], schema: pa.Schema) -> exp.Expression:
    if isinstance(node, exp.Literal) and not node.is_string:
        idx = int(node.this)
        if not 1 <= idx <= len(outputs):
            raise SqlError("SQL_PARSE_ERROR", f"position {idx} is not in the select list (1..{len(outputs)})")
        return outputs[idx - 1][1]
    if isinstance(node, exp.Column) and not node.table:
        names = {f.name.lower() for f in schema}
        if node.name.lower() not in names:
            for name, e in outputs:
                if name.lower() == node.name.lower():
                    return e
    return node


def _output_name(node: exp.Expression) -> str:
    if isinstance(node, exp.Alias):
        return node.alias
    if isinstance(node, exp.Column):
        return node.name
    return node.sql(dialect="duckdb")


def _expand_outputs(select: exp.Select, schema: pa.Schema) -> list[tuple[str, exp.Expression]]:
    out: list[tuple[str, exp.Expression]] = []
    for item in select.expressions:
        if isinstance(item, exp.Star) or (isinstance(item, exp.Column) and isinstance(item.this, exp.Star)):
            # rowtime is a pseudo-column (like ksqlDB's ROWTIME): selectable, not in *
            out.extend((f.name, exp.column(f.name)) for f in schema if f.name != "rowtime")
            continue
        name = _output_name(item)
        out.append((name, item.this if isinstance(item, exp.Alias) else item))
    return out


def _columns_used(nodes: list[exp.Expression], schema: pa.Schema) -> tuple[str, ...]:
    by_lower = {f.name.lower(): f.name for f in schema}
    used: list[str] = []
    for n in nodes:
        for col in n.find_all(exp.Column):
            name = by_lower.get(col.name.lower())
            if name is None:
                raise SqlError(
                    "UNKNOWN_COLUMN",
                    f"unknown column {col.name!r}; columns are {', '.join(f.name for f in schema)}",
                )
            if name not in used:
                used.append(name)
    return tuple(used) or (schema[0].name,)  # COUNT(*) still needs rows


def _int_clause(select: exp.Select, name: str) -> int | None:
    node = select.args.get(name)
    if node is None:
        return None
    value = node.expression if isinstance(node, (exp.Limit, exp.Offset)) else node
    if isinstance(value, exp.Literal) and not value.is_string and value.this.isdigit():
        return int(value.this)
    raise SqlError("INVALID_PARAMETER", f"{name.upper()} takes a non-negative integer, got {value.sql()}")


def plan_select(select: exp.Select, schema: pa.Schema, store: StoreDefinition | None, virtual: pa.Table | None,
                params: list[Any]) -> SelectPlan:
    _check_supported(select)
    outputs = _expand_outputs(select, schema)
    where = select.args.get("where")
    where_expr = where.this if where is not None else None
    group = select.args.get("group")
    group_items = [_resolve_alias_or_ordinal(g, outputs, schema) for g in (group.expressions if group else [])]
    having = select.args.get("having")
    having_expr = having.this if having is not None else None
    order_items = []
    order = select.args.get("order")
    for o in order.expressions if order else []:
        desc = bool(o.args.get("desc"))
        nulls_first = bool(o.args.get("nulls_first"))  # DuckDB's default: NULLS LAST either way
        order_items.append((_resolve_alias_or_ordinal(o.this, outputs, schema), desc, nulls_first))
    limit = _int_clause(select, "limit")
    offset = _int_clause(select, "offset") or 0
    distinct = select.args.get("distinct") is not None

    if where_expr is not None and any(True for _ in where_expr.find_all(exp.AggFunc)):
        raise SqlError("SQL_PARSE_ERROR", "aggregates are not allowed in WHERE; use HAVING")
    # validate every column and expression against the source schema early (clear errors)
    _columns_used([e for _, e in outputs] + ([where_expr] if where_expr is not None else []) + group_items, schema)
    if where_expr is not None:
        compile_expr(where_expr, schema)

    subqueries = plan_store_queries(store, where_expr, params) if store is not None else []
    where_sql = where_expr.sql(dialect="duckdb") if where_expr is not None else None
    aggregate = bool(group_items) or distinct or any(
        True for _, e in outputs for _ in e.find_all(exp.AggFunc)
    ) or having_expr is not None

    if not aggregate:
        for e, _, _ in order_items:
            compile_expr(e, schema)
        for _, e in outputs:
            compile_expr(e, schema)
        needed = _columns_used([e for _, e in outputs] + [e for e, _, _ in order_items], schema)
        keep = None if offset + (limit or 0) == 0 and limit is None else offset + (limit or 0)
        pipeline = Pipeline(
            where=where_sql,
            columns=needed,
            order_by=tuple(OrderKey(e.sql(dialect="duckdb"), d, n) for e, d, n in order_items),
            limit=keep if limit is not None else None,
        )
        return SelectPlan(schema, store, virtual, subqueries, pipeline, False, 0, [], outputs, None,
                          order_items, offset, limit)

    if distinct:
        if group_items:
            raise unsupported("SELECT DISTINCT with GROUP BY")
        group_items = [e for _, e in outputs]
    group_sql = [g.sql(dialect="duckdb") for g in group_items]
    for g in group_items:
        compile_expr(g, schema)
    aggs: list[tuple[str, str | None, bool, str]] = []
    agg_index: dict[str, int] = {}

    def rewrite(node: exp.Expression) -> exp.Expression:
        def swap(n: exp.Expression) -> exp.Expression:
            text = n.sql(dialect="duckdb")
            if text in group_sql:
                return exp.column(f"__g{group_sql.index(text)}")
            if isinstance(n, exp.AggFunc):
                func = AGG_FUNCS.get(type(n))
                if func is None:
                    raise unsupported(f"the aggregate {n.sql()}", "use COUNT, SUM, MIN, MAX or AVG")
                arg = n.this
                distinct_arg = isinstance(arg, exp.Distinct)
                if distinct_arg:
                    if func != "count" or len(arg.expressions) != 1:
                        raise unsupported(f"{n.sql()}", "DISTINCT works with COUNT of one column")
                    arg = arg.expressions[0]
                if isinstance(arg, exp.Star):
                    arg_sql = None
                else:
                    compile_expr(arg, schema)
                    if any(True for _ in arg.find_all(exp.AggFunc)):
                        raise SqlError("SQL_PARSE_ERROR", f"aggregates cannot nest: {n.sql()}")
                    arg_sql = arg.sql(dialect="duckdb")
                key = text
                if key not in agg_index:
                    agg_index[key] = len(aggs)
                    aggs.append((func, arg_sql, distinct_arg, f"__a{len(aggs)}"))
                return exp.column(f"__a{agg_index[key]}")
            if isinstance(n, exp.Column):
                raise SqlError(
                    "SQL_PARSE_ERROR",
                    f"column {n.name!r} must appear in GROUP BY or be used in an aggregate function",
                )
            return n

        return node.copy().transform(swap)

    new_outputs = [(name, rewrite(e)) for name, e in outputs]
    new_having = rewrite(having_expr) if having_expr is not None else None
    new_order = [(rewrite(e), d, n) for e, d, n in order_items]
    aggs = [(f, a, d, f"__a{i}") for i, (f, a, d, _) in enumerate(aggs)]
    pipeline = Pipeline(where=where_sql, group_by=tuple(group_sql), aggs=tuple(aggs), aggregate=True)
    return SelectPlan(schema, store, virtual, subqueries, pipeline, True, len(group_sql), aggs, new_outputs,
                      new_having, new_order, offset, limit)
