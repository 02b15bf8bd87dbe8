"""What the receiving node finishes: final aggregation, HAVING, ORDER BY (a merge of the
per-partition top-k), OFFSET/LIMIT and the select list, all on Arrow."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from federator.sql.aggregate import AggSpec, final
from federator.sql.evaluate import Compiled, compile_expr
from federator.sql.pipeline import parse_fragment, run, sort_indices
from federator.sql.planner import SelectPlan


def _concat(batches: list[pa.RecordBatch]) -> pa.Table:
    schema = batches[0].schema
    return pa.Table.from_batches([b if b.schema.equals(schema) else b.cast(schema) for b in batches])


def _compile(plan: SelectPlan, e: exp.Expression, schema: pa.Schema) -> Compiled:
    """``e`` compiled over ``schema``, once per plan (plans of repeated queries are kept)."""
    key = (id(e), schema)
    f = plan.compiled.get(key)
    if f is None:
        f = plan.compiled[key] = compile_expr(e, schema)
    return f


def _agg_specs(plan: SelectPlan) -> list[AggSpec]:
    specs = plan.compiled.get("aggs")
    if specs is None:
        specs = plan.compiled["aggs"] = [
            AggSpec(f, None if a is None else compile_expr(parse_fragment(a), plan.source_schema), d, n)
            for f, a, d, n in plan.aggs]
    return specs


def finish(plan: SelectPlan, batches: list[pa.RecordBatch]) -> pa.Table:
    if not batches:
        # nothing came back (no partition could hold a match): run the owner's part on no rows
        owner_part = run(plan.pipeline, pa.Table.from_pylist([], schema=plan.source_schema))
        batches = owner_part.to_batches() or [pa.RecordBatch.from_pylist([], schema=owner_part.schema)]
    table = _concat(batches)
    if plan.aggregate:
        table = final([table], plan.n_keys, _agg_specs(plan))
        table = table.rename_columns([f"__g{i}" for i in range(plan.n_keys)] + [f"__a{i}" for i in range(len(plan.aggs))])
    if plan.having is not None:
        mask = _compile(plan, plan.having, table.schema)(table)
        table = table.filter(pc.fill_null(mask, False))
    if plan.order:
        keys = [(_compile(plan, e, table.schema)(table), d, n) for e, d, n in plan.order]
        table = table.take(sort_indices(table, keys))
    if plan.offset or plan.limit is not None:
        table = table.slice(plan.offset, plan.limit)
    columns = [_compile(plan, e, table.schema)(table) for _, e in plan.outputs]
    return pa.Table.from_arrays(columns, names=[n for n, _ in plan.outputs])
