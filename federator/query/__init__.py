"""The query model (Kafka Streams IQv2, KIP-796): queries, requests, per-partition results, positions."""

from federator.query.position import Position, PositionBound
from federator.query.queries import (
    KeyQuery,
    KeysQuery,
    Query,
    RangeQuery,
    SessionQuery,
    UnknownQueryType,
    WindowKeyQuery,
    WindowRangeQuery,
    query_from_dict,
)
from federator.query.request import StateQueryRequest
from federator.query.result import FailureReason, QueryResult

__all__ = [
    "FailureReason",
    "KeyQuery",
    "KeysQuery",
    "Position",
    "PositionBound",
    "Query",
    "QueryResult",
    "RangeQuery",
    "SessionQuery",
    "StateQueryRequest",
    "UnknownQueryType",
    "WindowKeyQuery",
    "WindowRangeQuery",
    "query_from_dict",
]
