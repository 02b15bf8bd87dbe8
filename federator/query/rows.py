"""A few rows as Python values: what a store type answers from an index it keeps in memory (a
leaderboard's ranks and top-k), carried to a JSON answer without Arrow.

On an answer of a row or ten, building Arrow arrays, casting and measuring them cost more
than the read, and several of those calls let the GIL go: a thread applying writes then takes
it, and the answer waits for its turn. So the rows stay tuples until something needs Arrow (a
format other than JSON, DuckDB, the wire), which asks ``to_batch``.

A value is held as ``federator.http.formats.value_converter_for`` takes it: a timestamp as an
integer count of its unit since the epoch, the rest as Arrow's ``to_pylist`` gives them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import pyarrow as pa

from federator.memo import by_identity


@dataclass(frozen=True)
class Rows:
    schema: pa.Schema
    rows: list[tuple]

    @property
    def num_rows(self) -> int:
        return len(self.rows)

    def select(self, columns: list[str]) -> Rows:
        """These columns, in this order (KeyError for a column the rows lack, as Arrow's)."""
        at = [self.schema.get_field_index(c) for c in columns]
        if any(i < 0 for i in at):
            raise KeyError(f"no column {columns[at.index(-1)]!r} in {self.schema.names}")
        return Rows(pa.schema([self.schema.field(i) for i in at]), [tuple(r[i] for i in at) for r in self.rows])

    def slice(self, offset: int = 0, length: int | None = None) -> Rows:
        stop = None if length is None else offset + length
        return Rows(self.schema, self.rows[offset:stop])

    def rename_columns(self, names: list[str]) -> Rows:
        return Rows(pa.schema([f.with_name(n) for f, n in zip(self.schema, names)]), self.rows)

    def to_batch(self) -> pa.RecordBatch:
        columns = list(zip(*self.rows)) if self.rows else [()] * len(self.schema)
        return pa.RecordBatch.from_arrays([pa.array(c, f.type) for c, f in zip(columns, self.schema)], schema=self.schema)

    def to_table(self) -> pa.Table:
        return pa.Table.from_batches([self.to_batch()], self.schema)

    def batches(self) -> Iterator[pa.RecordBatch]:
        """The rows as Arrow, built only when iterated (a JSON answer never is)."""
        yield self.to_batch()


def concat_rows(parts: list[Rows], schema: pa.Schema) -> Rows | None:
    """The parts' rows in ``schema``, or None when a part's types differ from it (a cast is
    Arrow's to make)."""
    if any(not p.schema.equals(schema) for p in parts):
        return None
    if len(parts) == 1:
        return parts[0]
    return Rows(schema, [r for p in parts for r in p.rows])


def as_batch(batch: pa.RecordBatch | Rows) -> pa.RecordBatch:
    """Arrow for what a partition answered, whichever it holds."""
    return batch.to_batch() if isinstance(batch, Rows) else batch


# No rows in a schema: made once per schema object (batches are immutable; a shard's schema is
# one object), as point reads of absent keys and the failed partitions of a call each need one
empty_batch = by_identity(lambda schema: pa.RecordBatch.from_pylist([], schema=schema), 1024)
