"""The dispatcher's own errors, as the SQL layer maps them: code, status, message, partitions."""

from __future__ import annotations

import pytest

from federator.dispatch.errors import (
    DispatchError,
    NotColocated,
    NotUpToBound,
    OwnerFailed,
    Timeout,
    Unavailable,
)
from federator.query.queries import UnknownQueryType
from federator.query.result import FailureReason
from federator.sql.dispatch_errors import from_dispatch


@pytest.mark.parametrize("error, code, status", [
    (Timeout("nodes n2 did not answer in time", [3]), "TIMEOUT", 504),
    (NotUpToBound("partitions [1] have not caught up", [1]), "NOT_UP_TO_BOUND", 409),
    (Unavailable("partitions [0, 2] are unavailable", [0, 2]), "UNAVAILABLE", 503),
    (NotColocated("partition 4: parted by a rebalance", [4]), "UNAVAILABLE", 503),
])
def test_unanswered_partitions(error: DispatchError, code: str, status: int) -> None:
    sql = from_dispatch(error)
    assert (sql.code, sql.status, sql.message, sql.partitions) == (code, status, error.message, error.partitions)


def test_unavailable_says_when_to_retry() -> None:
    assert from_dispatch(Unavailable("down", [0])).retry_after == Unavailable.retry_after


def test_an_owner_failing_on_the_request_is_the_request_error() -> None:
    e = OwnerFailed(2, "n1", FailureReason.STORE_EXCEPTION, "Conversion Error: could not cast 'x'", "INVALID_DATA")
    sql = from_dispatch(e)
    assert (sql.code, sql.status, sql.message) == ("INVALID_DATA", 400, "Conversion Error: could not cast 'x'")


@pytest.mark.parametrize("failure, code", [(FailureReason.STORE_EXCEPTION, None),
                                           (FailureReason.STORE_EXCEPTION, "SOMETHING_ELSE"),
                                           (FailureReason.UNKNOWN_QUERY_TYPE, "INVALID_DATA")])
def test_any_other_owner_failure_is_internal(failure: FailureReason, code: str | None) -> None:
    sql = from_dispatch(OwnerFailed(2, "n1", failure, "RocksDB said no", code))
    assert sql.code == "INTERNAL" and sql.message == f"partition 2 on node n1: {failure.value}: RocksDB said no"


def test_an_unknown_query_type_names_the_plugin_to_install() -> None:
    e = UnknownQueryType("TopKQuery", "n3", "unknown query type 'TopKQuery'")
    assert from_dispatch(e).message == "node n3 cannot answer TopKQuery: unknown query type 'TopKQuery'"
    named = from_dispatch(e, {"query type TopKQuery": "leaderboard"}.get)
    assert named.code == "UNKNOWN_QUERY_TYPE" and named.status == 422
    assert "which the plugin 'leaderboard' provides: install the plugin 'leaderboard' on every node" in named.message
