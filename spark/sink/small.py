"""Small writes from the driver. A Spark pass 2 starts a Python task per partition, ~0.4 s
however few the rows: most of a small write's time (a streaming micro-batch writes four stores
of a few hundred rows each). So a write of at most SMALL_ROWS rows produces them from the
driver, with the code a task runs:

- when Spark's estimate says the rows are few, pass 1 brings them back whole with their key
  hashes (one Spark job: the rows checked are the rows written);
- else, when pass 1 counts few, pass 2 brings them back (one job, no Python task)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from spark.sink.checks import estimated_rows
from spark.sink.producing import WriteSpec, forget_producers, produce_batches

# Up to this many rows a write runs on the driver. Spark's estimate picks the writes worth
# trying (it may be off a few times either way); the job reads at most one row more, so a
# larger DataFrame is found out and written the two-pass way.
SMALL_ROWS = 20_000


@dataclass(frozen=True)
class Held:
    """What a task reads from a Broadcast (``value``), held by the driver itself."""

    value: Any


def is_small(rows: int) -> bool:
    return rows <= SMALL_ROWS


def fetch_small(staged: Any) -> pa.Table | None:
    """``staged``'s rows (write columns and ``h``) when it has at most SMALL_ROWS, else None."""
    estimate = estimated_rows(staged)
    if estimate is None or estimate > 4 * SMALL_ROWS:
        return None
    table = staged.limit(SMALL_ROWS + 1).toArrow()
    return table if is_small(table.num_rows) else None


def with_bad(table: pa.Table) -> pa.Table:
    """fetch_small's rows as pass 2 reads them: ``bad`` (the row fails a check) for ``h``."""
    return table.drop_columns(["h"]).append_column("bad", pc.is_null(table.column("h")))


def produce_small(spec: WriteSpec, rows: pa.Table) -> list[dict[str, Any]]:
    """Pass 2 on the driver (``rows``: the write columns and ``bad``): per Kafka partition its
    last offset, as the tasks report it."""
    try:
        return produce_batches(spec, iter(rows.to_batches())).to_pylist()
    except BaseException:
        forget_producers(spec)  # a producer that failed (e.g. a fatal idempotence error) is not reused
        raise
