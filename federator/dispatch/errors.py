"""Why the dispatcher could not gather every partition's answer.

The dispatcher knows nodes, partitions and per-partition failures, not SQL: it raises these,
and the SQL layer maps each to its error code and HTTP status (federator.errors).
"""

from __future__ import annotations

from federator.query.result import FailureReason


class DispatchError(Exception):
    """Base: ``partitions`` are the ones that did not answer, when that is known."""

    def __init__(self, message: str, partitions: list[int] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.partitions = partitions


class Timeout(DispatchError):
    """Nodes did not answer before the request's deadline."""


class Unavailable(DispatchError):
    """No copy answered for some partitions before the deadline (no owner, or none that could)."""

    retry_after = 1.0  # seconds a client should wait: about a heartbeat, when routing may have moved


class NotUpToBound(DispatchError):
    """Every missing partition was reachable but behind the consistency token."""


class NotColocated(DispatchError):
    """A co-partitioned join cannot run on the owners: the caller joins at the receiver instead."""


class UnknownQueryType(DispatchError):
    """A node has no class for the query type (the plugin that provides it is not installed there)."""

    def __init__(self, type_name: str, node_id: str, reason: str) -> None:
        super().__init__(f"node {node_id} cannot answer {type_name}: {reason}")
        self.type_name, self.node_id, self.reason = type_name, node_id, reason


class OwnerFailed(DispatchError):
    """An owner answered a partition with a failure that retrying elsewhere cannot fix.

    ``code`` is the owner's (QueryResult.code): for an error in the work it ran for the caller
    (the pushed-down SQL), the caller's own code for it."""

    def __init__(self, partition: int, node_id: str, failure: FailureReason, message: str, code: str | None) -> None:
        super().__init__(f"partition {partition} on node {node_id}: {failure.value}: {message}", [partition])
        self.partition, self.node_id, self.failure, self.owner_message, self.code = (
            partition, node_id, failure, message, code)
