"""Why the dispatcher could not gather every partition's answer.

The dispatcher knows nodes, partitions and per-partition failures, not SQL: it raises these,
each with its error code (federator.errors), and the SQL layer words them for the statement
(federator.sql.dispatch_errors). A node without the query type's plugin raises
federator.query.queries.UnknownQueryType.
"""

from __future__ import annotations

from federator.errors import FederatorError
from federator.query.result import FailureReason


class DispatchError(FederatorError):
    """Base: ``partitions`` are the ones that did not answer, when that is known."""

    code = "UNAVAILABLE"

    def __init__(self, message: str, partitions: list[int] | None = None) -> None:
        super().__init__(message, **({} if partitions is None else {"partitions": partitions}))
        self.partitions = partitions


class Timeout(DispatchError):
    """Nodes did not answer before the request's deadline."""

    code = "TIMEOUT"


class Unavailable(DispatchError):
    """No copy answered for some partitions before the deadline (no owner, or none that could)."""

    retry_after = 1.0  # seconds a client should wait: about a heartbeat, when routing may have moved


class NotUpToBound(DispatchError):
    """Every missing partition was reachable but behind the consistency token."""

    code = "NOT_UP_TO_BOUND"


class NotNow(DispatchError):
    """An ``at_once`` read (ReadOptions) that a copy could not answer as it is now: the caller
    reads again where it may wait (control flow, never an answer)."""


class NotColocated(DispatchError):
    """A co-partitioned join cannot run on the owners: the caller joins at the receiver instead
    (control flow; should one escape, its partitions were unavailable)."""


class OwnerFailed(DispatchError):
    """An owner answered a partition with a failure that retrying elsewhere cannot fix.

    ``owner_code`` is the owner's (QueryResult.code): for an error in the work it ran for the
    caller (the pushed-down SQL), the caller's own code for it."""

    code = "INTERNAL"

    def __init__(self, partition: int, node_id: str, failure: FailureReason, message: str,
                 owner_code: str | None) -> None:
        super().__init__(f"partition {partition} on node {node_id}: {failure.value}: {message}", [partition])
        self.partition, self.node_id, self.failure, self.owner_message, self.owner_code = (
            partition, node_id, failure, message, owner_code)
