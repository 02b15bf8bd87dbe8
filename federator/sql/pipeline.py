"""What runs on the node that holds a partition, so rows that fail a filter never cross the network.

A pipeline travels inside the internal query request as SQL fragments (already bound:
parameters are literals by then); the owner compiles them once per text and applies
them to each partition's rows: filter, then either a partial aggregation or a top-k
and a projection of the columns the receiver still needs.
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import sqlglot
from sqlglot import exp

from federator.sql.aggregate import AggSpec, partial
from federator.sql.evaluate import compile_expr


@dataclass(frozen=True)
class OrderKey:
    sql: str
    descending: bool = False
    nulls_first: bool = False


@dataclass(frozen=True)
class Pipeline:
    where: str | None = None
    columns: tuple[str, ...] | None = None  # source columns kept (None = all)
    group_by: tuple[str, ...] = ()
    aggs: tuple[tuple[str, str | None, bool, str], ...] = ()  # (func, arg sql, distinct, name)
    order_by: tuple[OrderKey, ...] = ()
    limit: int | None = None  # rows each partition keeps after ordering (offset + limit)
    aggregate: bool = False

    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(asdict(self)))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Pipeline:
        return cls(
            where=d.get("where"),
            columns=None if d.get("columns") is None else tuple(d["columns"]),
            group_by=tuple(d.get("group_by") or ()),
            aggs=tuple(tuple(a) for a in d.get("aggs") or ()),  # type: ignore[misc]
            order_by=tuple(OrderKey(**o) for o in d.get("order_by") or ()),
            limit=d.get("limit"),
            aggregate=bool(d.get("aggregate")),
        )

    def describe(self) -> str:
        parts = []
        if self.where:
            parts.append(f"filter {self.where}")
        if self.aggregate:
            keys = ", ".join(self.group_by)
            aggs = ", ".join(f"{f}({'DISTINCT ' if d else ''}{a or '*'})" for f, a, d, _ in self.aggs)
            parts.append(f"partial aggregate {aggs}" + (f" by {keys}" if keys else ""))
        else:
            if self.order_by and self.limit is not None:
                keys = ", ".join(f"{o.sql} {'DESC' if o.descending else 'ASC'}" for o in self.order_by)
                parts.append(f"top {self.limit} by {keys}")
            if self.columns is not None:
                parts.append(f"columns {', '.join(self.columns)}")
        return "; ".join(parts) or "nothing"


@functools.lru_cache(maxsize=1024)
def parse_fragment(sql: str) -> exp.Expression:
    return sqlglot.parse_one(sql, read="duckdb")


@functools.lru_cache(maxsize=1024)
def _compiled(sql: str, schema: pa.Schema):
    return compile_expr(parse_fragment(sql), schema)


def sort_indices(table: pa.Table, keys: list[tuple[pa.Array, bool, bool]]) -> pa.Array:
    """Indices ordering ``table`` by (values, descending, nulls_first) keys, per-key null placement."""
    cols: dict[str, pa.Array] = {}
    sort_keys = []
    for i, (values, desc, nulls_first) in enumerate(keys):
        # A null flag before each key gives every key its own NULLS FIRST/LAST.
        cols[f"n{i}"] = pc.is_null(values)
        cols[f"k{i}"] = values
        sort_keys.append((f"n{i}", "descending" if nulls_first else "ascending"))
        sort_keys.append((f"k{i}", "descending" if desc else "ascending"))
    return pc.sort_indices(pa.table(cols), sort_keys=sort_keys)


@functools.lru_cache(maxsize=1024)
def _aggregation(pipeline: Pipeline, schema: pa.Schema) -> tuple[list, list[AggSpec]]:
    """The group keys and aggregates of ``pipeline`` compiled over ``schema``."""
    keys = [_compiled(g, schema) for g in pipeline.group_by]
    return keys, [AggSpec(f, None if a is None else _compiled(a, schema), d, n) for f, a, d, n in pipeline.aggs]


def run(pipeline: Pipeline, batch: pa.RecordBatch | pa.Table) -> pa.Table:
    table = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
    schema = table.schema
    if pipeline.where:
        mask = _compiled(pipeline.where, schema)(table)
        table = table.filter(pc.fill_null(mask, False))
    if pipeline.aggregate:
        keys, aggs = _aggregation(pipeline, schema)
        return partial(table, keys, aggs)
    if pipeline.limit is not None and table.num_rows > pipeline.limit:
        if pipeline.order_by:
            keys = [(_compiled(o.sql, schema)(table), o.descending, o.nulls_first) for o in pipeline.order_by]
            table = table.take(sort_indices(table, keys)[: pipeline.limit])
        else:  # any rows will do: the receiver needs no more than offset + limit of them
            table = table.slice(0, pipeline.limit)
    if pipeline.columns is not None:
        table = table.select(list(pipeline.columns))
    return table


def as_batch(table: pa.Table) -> pa.RecordBatch:
    """One record batch (the wire carries one per partition)."""
    table = table.combine_chunks()
    batches = table.to_batches()
    if not batches:
        return pa.RecordBatch.from_pylist([], schema=table.schema)
    return batches[0] if len(batches) == 1 else pa.Table.from_batches(batches).combine_chunks().to_batches()[0]


__all__ = ["OrderKey", "Pipeline", "as_batch", "run", "sort_indices", "field"]
