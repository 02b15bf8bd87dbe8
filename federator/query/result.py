"""Per-partition query results: an Arrow batch with the partition's Position, or a typed failure."""

from __future__ import annotations

import enum
import operator
from dataclasses import dataclass, field

import pyarrow as pa

from federator.query.position import Position
from federator.query.rows import Rows


class FailureReason(str, enum.Enum):
    UNKNOWN_QUERY_TYPE = "UNKNOWN_QUERY_TYPE"  # the store type (or this node) does not know the query
    NOT_ACTIVE = "NOT_ACTIVE"  # a standby or restoring shard, and the request required an active one
    NOT_UP_TO_BOUND = "NOT_UP_TO_BOUND"  # the shard is behind the request's position bound
    NOT_PRESENT = "NOT_PRESENT"  # this node does not host the partition
    DOES_NOT_EXIST = "DOES_NOT_EXIST"  # no such store or partition
    STORE_EXCEPTION = "STORE_EXCEPTION"  # the store failed while answering


@dataclass
class QueryResult:
    partition: int
    # Rows: a global store's answer read on the node asked (a together handler), which never
    # crosses the wire
    batch: pa.RecordBatch | Rows | None = None
    position: Position | None = None
    failure: FailureReason | None = None
    message: str = ""
    # for STORE_EXCEPTION: whose fault, as the SQL error code the receiver answers with
    # (INVALID_DATA: the data made the pushed-down SQL fail; None: the store failed)
    code: str | None = None
    execution_info: list[str] = field(default_factory=list)

    @classmethod
    def success(cls, partition: int, batch: pa.RecordBatch | Rows, position: Position) -> QueryResult:
        return cls(partition, batch=batch, position=position)

    @classmethod
    def failed(cls, partition: int, reason: FailureReason, message: str, code: str | None = None) -> QueryResult:
        return cls(partition, failure=reason, message=message, code=code)

    @property
    def ok(self) -> bool:
        return self.failure is None

    def __repr__(self) -> str:
        if self.ok:
            rows = 0 if self.batch is None else self.batch.num_rows
            return f"QueryResult(partition={self.partition}, rows={rows}, position={self.position})"
        return f"QueryResult(partition={self.partition}, failure={self.failure.value}, message={self.message!r})"


def all_ok(results: list[QueryResult]) -> bool:
    """Whether none of ``results`` failed: looked over in C (a global store's read of every
    partition at once gives a result a partition, thousands of times a second)."""
    return not any(map(_FAILURE, results))


_FAILURE = operator.attrgetter("failure")  # a FailureReason is a non-empty str: always true
