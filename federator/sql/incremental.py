"""Partial aggregates kept up to date from writes, instead of computed again over the shard.

COUNT(*), COUNT(x), and SUM/AVG of integers have states that can be taken back: a write's
effect is the partial over the rows it added minus the partial over the rows it removed. The
state kept carries two counts more than the query's (rows per group, and values per SUM), so
a group whose rows are all gone is dropped and a sum with no value left is NULL, exactly as
computing it again would give. Integer sums are DECIMAL(38,0) states, so adding and taking
back is exact; float sums are not (1e20 + 1 - 1e20), MIN/MAX cannot be taken back, and
COUNT(DISTINCT) would need every value: those are computed again over the brought-up-to-date
scan (federator.store.scan_cache).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from federator.sql.evaluate import _kind
from federator.sql.pipeline import Pipeline, _compiled, as_batch, run

__all__ = ["MaintainedAggregate", "maintained_aggregate"]


@dataclass(frozen=True)
class MaintainedAggregate:
    key: str  # the query's pipeline, as the scan cache names it
    pipeline: Pipeline  # the query's aggregates, then COUNT(*) and one COUNT(x) per SUM(x)
    n_keys: int
    answer_columns: tuple[str, ...]  # the query's partial: group keys, then its states
    nulled_by: tuple[tuple[str, str], ...]  # (sum state, the count saying whether it has a value)
    rows: str  # the row count per group

    def over(self, rows: pa.Table | pa.RecordBatch) -> pa.Table:
        return run(self.pipeline, rows)

    def advance(self, state: pa.Table, removed: pa.Table, added: pa.Table) -> pa.Table:
        """``state`` after ``removed`` rows went and ``added`` rows came."""
        parts = [state]
        if added.num_rows:
            parts.append(self.over(added))
        if removed.num_rows:
            taken = self.over(removed)
            parts.append(pa.table([c if i < self.n_keys else pc.negate(c) for i, c in enumerate(taken.columns)],
                                  schema=taken.schema))
        union = pa.concat_tables(parts)
        if not self.n_keys:  # one row: a group without rows is no row at all, as partial() gives
            sums = [pc.sum(c, min_count=1) for c in union.columns]
            rows = sums[union.column_names.index(self.rows)].as_py()
            return pa.Table.from_arrays([pa.repeat(v, 1) for v in sums], schema=state.schema) if rows else \
                state.schema.empty_table()
        states = union.column_names[self.n_keys:]
        keys = union.column_names[: self.n_keys]
        grouped = union.group_by(keys, use_threads=False).aggregate([(c, "sum") for c in states])
        summed = pa.table({**{k: grouped[k] for k in keys}, **{c: grouped[f"{c}_sum"] for c in states}})
        summed = summed.cast(state.schema)
        return summed.filter(pc.greater(pc.fill_null(summed[self.rows], 0), 0))

    def answer(self, state: pa.Table) -> pa.RecordBatch:
        """The query's own partial states (what running its pipeline over the rows gives)."""
        cols = {c: state[c] for c in self.answer_columns}
        for total, count in self.nulled_by:
            empty = pc.equal(state[count], 0)
            cols[total] = pc.if_else(empty, pa.nulls(len(state), state.schema.field(total).type), state[total])
        return as_batch(pa.table(cols))


@functools.lru_cache(maxsize=256)
def maintained_aggregate(key: str, schema: pa.Schema) -> MaintainedAggregate | None:
    """How to keep the pipeline ``key`` (its JSON) up to date over rows of ``schema``, or None
    when some aggregate's state cannot be taken back."""
    spec: dict[str, Any] = json.loads(key)
    if not spec.get("aggregate"):
        return None
    pipeline = Pipeline.from_dict(spec)
    try:
        kinds = [None if a is None else _kind(_compiled(a, schema).type) for _, a, _, _ in pipeline.aggs]
    except Exception:  # noqa: BLE001 - a pipeline that does not compile fails on the ordinary path
        return None
    extra: list[tuple[str, str | None, bool, str]] = [("COUNT", None, False, "__rows")]
    nulled_by = []
    for i, ((name, arg, distinct, _), kind) in enumerate(zip(pipeline.aggs, kinds)):
        func = name.upper()
        if distinct or not (func == "COUNT" or (func in ("SUM", "AVG") and kind == "int")):
            return None
        if func == "SUM":
            nulled_by.append((f"__a{i}_sum", f"__a{len(pipeline.aggs) + len(extra)}_count"))
            extra.append(("COUNT", arg, False, f"__values{i}"))
        elif func == "AVG":
            nulled_by.append((f"__a{i}_sum", f"__a{i}_count"))
    n = len(pipeline.aggs)
    augmented = dataclasses.replace(pipeline, aggs=pipeline.aggs + tuple(extra))
    answer = run(pipeline, schema.empty_table()).column_names
    return MaintainedAggregate(key, augmented, len(pipeline.group_by), tuple(answer), tuple(nulled_by),
                               f"__a{n}_count")
