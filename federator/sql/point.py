"""The point lookup, planned once per SQL text: `SELECT cols FROM kv_store WHERE key = ?`.

It is the query BI tools and services send most, and it needs none of the general
machinery: no expression to compile, nothing to merge. Its plan is a store, the key's
place (a parameter or a literal) and the columns to return, reused for every key. The key
is read in-process (``Node.read_local``: a LocalKeyQuery down the store's layers) and its
entry decoded by the store's type (``StoreType.decode_row``), not by a layout assumed here.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator

import pyarrow as pa
from sqlglot import exp

from federator.catalog.definition import StoreDefinition
from federator.formats import FormatError
from federator.plan.keys import NotALiteral, answers_key_queries, literal_value
from federator.sql.catalog_tables import names_store_schema


@dataclass(frozen=True)
class PointPlan:
    store: StoreDefinition
    key_node: exp.Expression  # a ? placeholder or a literal
    columns: tuple[str, ...]  # source columns, in output order
    names: tuple[str, ...]  # output names
    duckdb_schema: pa.Schema | None = None  # DuckDB's answer schema for the statement (typed())

    @functools.cached_property
    def schema(self) -> pa.Schema:
        """The answer's schema: DuckDB's where known, else the selected columns under their output names."""
        return self.duckdb_schema if self.duckdb_schema is not None else self._decoded

    @functools.cached_property
    def _decoded(self) -> pa.Schema:
        source = self.store.arrow_schema()
        return pa.schema([source.field(c).with_name(n) for c, n in zip(self.columns, self.names)])

    def typed(self, answer: pa.Schema | None) -> PointPlan | None:
        """This plan answering with ``answer``, DuckDB's schema for the statement; None when
        DuckDB names its columns otherwise (``+ x`` is no plain column to it)."""
        if answer is None or tuple(answer.names) != self.names:
            return None
        return replace(self, duckdb_schema=answer)

    @functools.cached_property
    def _names(self) -> list[str]:
        return [f"c{i}" for i in range(len(self.columns))]  # output names may repeat; struct fields may not

    @functools.cached_property
    def _struct(self) -> pa.DataType:
        return pa.struct([f.with_name(n) for f, n in zip(self._decoded, self._names)])

    @functools.cached_property
    def _decode(self) -> Callable[[bytes, bytes], tuple] | None:
        """The store type's decoder of one entry into the selected columns; None when the type
        does not decode entries one at a time."""
        return self.store.store_type.row_decoder(self.store, self.columns)

    def answer(self, key: bytes, stored: bytes | None) -> PointAnswer | None:
        """The answer for one key's stored entry (``key`` its bytes; ``stored`` None: no such
        key), decoded by the store's type; None when the type does not decode entries one at
        a time (the general path answers)."""
        if stored is None:
            return PointAnswer(self, [])
        decode = self._decode
        return None if decode is None else PointAnswer(self, [decode(key, stored)])

    def key(self, params: list[Any]) -> Any | None:
        """The key to look up, in the store's key type; None when the general path should decide."""
        try:
            value = literal_value(self.key_node, params)
            if value is None:
                return None
            return self.store.key.coerce(value)
        except (NotALiteral, FormatError, ValueError, TypeError):
            return None


def point_plan(select: exp.Select, stores: dict[str, StoreDefinition]) -> PointPlan | None:
    """A PointPlan when ``select`` is a plain key lookup on a kv store, else None."""
    if any(select.args.get(a) for a in ("group", "having", "order", "limit", "offset", "distinct", "joins", "with_", "qualify")):
        return None
    source = select.args.get("from_") or select.args.get("from")
    table = source.this if source is not None else None
    if not isinstance(table, exp.Table) or not isinstance(table.this, exp.Identifier) \
            or not names_store_schema(table.catalog, table.db):
        return None
    defn = stores.get(table.name)
    if defn is None or not answers_key_queries(defn):
        return None
    where = select.args.get("where")
    cond = where.this if where is not None else None
    if not isinstance(cond, exp.EQ):
        return None
    key_node = None
    for col, other in ((cond.this, cond.expression), (cond.expression, cond.this)):
        if isinstance(col, exp.Column) and col.name.lower() == defn.key_name.lower() and isinstance(
            other, (exp.Placeholder, exp.Literal)
        ):
            key_node = other
    if key_node is None:
        return None
    fields = {f.name.lower(): f.name for f in defn.arrow_schema()}
    columns, names = [], []
    for item in select.expressions:
        if isinstance(item, exp.Star):
            cols = [f.name for f in defn.arrow_schema() if f.name != "rowtime"]
            columns += cols
            names += cols
            continue
        alias = item.alias if isinstance(item, exp.Alias) else None
        node = item.this if isinstance(item, exp.Alias) else item
        if not isinstance(node, exp.Column) or node.table or node.name.lower() not in fields:
            return None
        columns.append(fields[node.name.lower()])
        names.append(alias or node.name)
    return PointPlan(defn, key_node, tuple(columns), tuple(names))


@dataclass(frozen=True)
class PointAnswer:
    """A point lookup's answer as Python rows; Arrow only if a format asks for it."""

    plan: PointPlan
    rows: list[tuple]

    @property
    def schema(self) -> pa.Schema:
        return self.plan.schema

    @property
    def num_rows(self) -> int:
        return len(self.rows)

    def batches(self) -> Iterator[pa.RecordBatch]:
        """The rows as Arrow, built only when iterated (a JSON answer never is)."""
        if not self.rows:
            yield pa.RecordBatch.from_pylist([], schema=self.schema)
            return
        # one struct array builds every column in one call: about half the cost of one array each
        structs = pa.array([dict(zip(self.plan._names, r)) for r in self.rows], self.plan._struct)
        batch = pa.RecordBatch.from_struct_array(structs).rename_columns(list(self.plan.names))
        yield batch if batch.schema.equals(self.schema) else batch.cast(self.schema)
