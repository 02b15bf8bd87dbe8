"""What the SQL engine hands the HTTP layer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

import pyarrow as pa

from federator.cancel import Cancel


@dataclass
class SqlRequest:
    sql: str
    parameters: list[Any] = field(default_factory=list)
    consistency_token: str | None = None
    allow_stale: bool = False
    max_lag: int | None = None
    timeout_ms: int = 10_000
    dialect: str | None = None  # the SQL's dialect (sqlglot's names); None: DuckDB's
    cancel: Cancel | None = None  # the client's cancel switch (the Postgres protocol's cancel request)


@dataclass
class SqlResult:
    schema: pa.Schema
    batches: Iterator[pa.RecordBatch]  # may be consumed once; large results arrive batch by batch
    consistency_token: str
    stats: dict[str, Any]  # partitions_queried, nodes, rows, elapsed_ms (rows/elapsed final once batches are consumed)
    # The same rows as Python values, when the engine has them without Arrow (a point lookup);
    # a JSON answer is then written from them and ``batches`` is never built.
    rows: list[tuple] | None = None
