"""The dispatcher's own errors (federator.dispatch.errors) as SQL errors: the code, status and
message a client gets when partitions cannot be read."""

from __future__ import annotations

from typing import Callable

from federator.dispatch.errors import DispatchError, OwnerFailed
from federator.errors import SqlError
from federator.query.queries import UnknownQueryType
from federator.query.result import FailureReason

# Codes an owner may give a STORE_EXCEPTION that are the request's fault: the SQL it was
# sent, or the data that SQL met (see QueryResult.code).
OWNER_USER_ERRORS = {"INVALID_DATA", "SQL_PARSE_ERROR", "UNKNOWN_COLUMN", "UNSUPPORTED", "TIMEOUT"}


def from_dispatch(e: DispatchError | UnknownQueryType,
                  provider_of: Callable[[str], str | None] = lambda what: None) -> SqlError:
    """The SQL error a dispatch failure is; ``provider_of`` (the registry's) names the plugin
    behind a query type a node does not know."""
    if isinstance(e, UnknownQueryType):
        plugin = provider_of(f"query type {e.type_name}")
        if plugin is None:
            return SqlError(e.code, str(e))
        return SqlError(e.code, (
            f"node {e.node_id} cannot answer {e.type_name}, which the plugin {plugin!r} provides: install the plugin "
            f"{plugin!r} on every node of the cluster and restart them ({e.reason})"))
    if isinstance(e, OwnerFailed):
        if e.failure is FailureReason.STORE_EXCEPTION and e.owner_code in OWNER_USER_ERRORS:
            return SqlError(e.owner_code, e.owner_message)  # the data or the SQL made the owner's part fail
        return SqlError(e.code, e.message)
    # the partitions that could not be read, with the dispatcher's own code (NotColocated, handled
    # where it is raised by joining at the receiver, would be UNAVAILABLE)
    return SqlError(e.code, e.message, partitions=e.partitions, retry_after=e.retry_after)
