"""Small writes from the driver. A Spark pass 2 starts a Python task per partition, ~0.4 s
however few the rows: most of a small write's time (a streaming micro-batch writes four stores
of a few hundred rows each). So a write that fits (SMALL_ROWS, SMALL_BYTES) produces its rows
from the driver, with the code a task runs:

- when Spark's estimate says the rows are few, pass 1 brings them back whole with their key
  hashes (one Spark job: the rows checked are the rows written);
- else, when pass 1 counts few, pass 2 brings them back (one job, no Python task)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from federator_spark.sink.producing import WriteSpec, forget_producers, produce_batches

# A write runs on the driver when it has at most SMALL_ROWS rows and Spark estimates them at
# most SMALL_BYTES (the driver holds them, as Arrow). At 200,000 rows (tests/bench/
# test_bench_sink.py, 2 cores) the driver and Spark's two Python tasks took about as long,
# runs varying more than they differed; below that the tasks' start-up dominates.
SMALL_ROWS = 20_000
SMALL_BYTES = 64 << 20
GUESS_BYTES = 4 << 20


@dataclass(frozen=True)
class Held:
    """What a task reads from a Broadcast (``value``), held by the driver itself."""

    value: Any


Estimate = tuple[int | None, int | None]  # federator_spark.sink.checks.estimate: (row count if known, size in bytes)


def fits(rows: int, guess: Estimate) -> bool:
    """Whether a write of ``rows`` rows (counted by pass 1) runs on the driver."""
    size = guess[1]
    return rows <= SMALL_ROWS and size is not None and size <= SMALL_BYTES


def fetch_small(staged: Any, guess: Estimate) -> pa.Table | None:
    """``staged``'s rows (write columns and ``h``) when ``guess``, Spark's estimate of them,
    says they fit, else None.

    Spark knows the row count of cached or local data (a cost-based optimizer may guess one):
    then the rows are read as they are. Otherwise it knows a size, which may be off a few times
    either way: a plan estimated at most GUESS_BYTES is read through a limit of one row more
    than fits (a limit gathers the rows in one task, which costs more than the two passes above
    a few MB). Either way a DataFrame found larger goes the two-pass way."""
    rows, size = guess
    if rows is not None:
        if rows > SMALL_ROWS or size is None or size > SMALL_BYTES:
            return None
        table = staged.toArrow()
    elif size is not None and size <= GUESS_BYTES:
        table = staged.limit(SMALL_ROWS + 1).toArrow()
    else:
        return None
    return table if table.num_rows <= SMALL_ROWS else None


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
