"""A statement's answer, from the rows its store references read to the SqlResult the front
doors send: finished in Arrow (or in Python, for rows a global store's type gave as Python
values) when DuckDB has nothing to do, counted as it streams out, and what is small enough to
give on an HTTP server's event loop."""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator

import pyarrow as pa

from federator.errors import SqlError
from federator.owner.duck_types import wire_schema
from federator.query.position import Position
from federator.query.rows import Rows, as_batch, concat_rows
from federator.sql.finish import TopRows
from federator.sql.planner import QueryPlan, StoreRef
from federator.sql.point import PointAnswer
from federator.sql.result import SqlResult

Relation = pa.Table | Rows  # a store reference's rows as read
Answer = tuple[pa.Schema, Iterator[pa.RecordBatch]] | Rows  # a statement's answer: streamed, or Python values

# What answer_now gives on the caller's event loop, which serves every other connection
# meanwhile: a kept answer of at most AT_ONCE_MAX_BYTES (making a larger one's body would hold
# the loop), and a global store's statement whose ORDER BY ... LIMIT keeps at most AT_ONCE_ROWS.
AT_ONCE_MAX_BYTES = 64 * 1024
AT_ONCE_ROWS = 1_000


def check_deadline(deadline: float, during: str) -> None:
    if time.monotonic() >= deadline:
        raise SqlError("TIMEOUT", f"the query ran past timeout_ms while {during}; raise timeout_ms or narrow the query")


def counted_batches(batches: Iterator[pa.RecordBatch], stats: dict[str, Any], started: float,
                    ended: Callable[[str], None]) -> Iterator[pa.RecordBatch]:
    """The batches as they come, with the answer's row count and time kept in ``stats``;
    ``ended`` hears how the answer ended: "ok", the SqlError's code, or CANCELLED when the
    reader stopped before the end."""
    outcome = "CANCELLED"
    try:
        for batch in batches:
            stats["rows"] += batch.num_rows
            stats["elapsed_ms"] = round((time.perf_counter() - started) * 1000, 3)
            yield batch
        outcome = "ok"
    except SqlError as e:
        outcome = e.code
        raise
    except Exception:
        outcome = "INTERNAL"
        raise
    finally:
        stats["elapsed_ms"] = round((time.perf_counter() - started) * 1000, 3)
        ended(outcome)


def answer_stats(partitions: int = 0, nodes: int = 0) -> dict[str, Any]:
    """The stats an answer starts with: the partitions and nodes it read (its rows and time
    are set when it is finished, ``finished``)."""
    return {"partitions_queried": partitions, "nodes": nodes, "rows": 0, "elapsed_ms": 0.0}


def relation_of(ref: StoreRef, batches: list) -> Relation:
    """A store reference's rows as the owners answered them, as one table (or the Python
    values a global store's type gave on this node, ``Rows``)."""
    schema = wire_schema(ref.rows_schema) if ref.rows_schema is not None else ref.store.arrow_schema()
    if batches and all(isinstance(b, Rows) for b in batches):  # a global store's rows read here at once
        rows = concat_rows([b for b in batches if b.num_rows], schema)
        if rows is not None:
            return rows
    if not batches:
        return schema.empty_table()
    return pa.Table.from_batches([b if b.schema.equals(schema) else b.cast(schema) for b in map(as_batch, batches)],
                                 schema)


def finished_without_duck(plan: QueryPlan, rows: Relation, stats: dict[str, Any]) -> Relation | None:
    """The answer over one store reference's ``rows`` when DuckDB has nothing to do: its
    columns as the statement names them, or its finish (a merge of states, a top-k cut) in
    Arrow (or in Python, for rows that came as Python values); None when DuckDB must finish it."""
    if plan.columns_only is not None:  # nothing left to compute: the rows as the owners sent them
        table = rows.select([c for c, _ in plan.columns_only]).rename_columns([n for _, n in plan.columns_only])
        return typed(table, plan.schema)
    if plan.finish is not None:  # in Arrow unless the types need DuckDB
        table = plan.finish.apply(rows, plan.schema) if isinstance(plan.finish, TopRows) \
            else plan.finish.apply(as_arrow(rows), plan.schema)
        if table is not None:
            stats["finished_in_arrow"] = True
        return table
    return None


def finished(table: pa.Table | PointAnswer | Rows, position: Position, stats: dict[str, Any],
             started: float) -> SqlResult:
    """A statement's whole answer (not streamed), with its row count and time in ``stats``."""
    stats["rows"] = table.num_rows
    stats["elapsed_ms"] = round((time.perf_counter() - started) * 1000, 3)
    if isinstance(table, pa.Table):
        return SqlResult(table.schema, iter(table.to_batches()), position.to_token(), stats)
    return SqlResult(table.schema, table.batches(), position.to_token(), stats, rows=table.rows)


def as_arrow(rows: Relation) -> pa.Table:
    return rows.to_table() if isinstance(rows, Rows) else rows


def typed(rows: Relation, schema: pa.Schema | None) -> Relation:
    """``rows`` in DuckDB's types for the statement (``schema``; None: as they are), as ever;
    Python values stay so where their types are those already."""
    if schema is None:
        return rows
    if isinstance(rows, Rows):
        if rows.schema.types == schema.types:
            return Rows(schema, rows.rows)
        rows = rows.to_table()
    return rows.cast(schema)


def answer_of(table: Relation) -> Answer:
    """A whole answer as ``SqlEngine._answer`` gives one: Rows as they are, a table as its batches."""
    return table if isinstance(table, Rows) else (table.schema, iter(table.to_batches()))
