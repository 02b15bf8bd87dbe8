"""The query model (Kafka Streams IQv2, KIP-796): queries, requests, per-partition results, positions."""

from federator.query.position import Position, PositionBound
from federator.query.queries import (
    KeyQuery,
    KeysQuery,
    Query,
    RangeQuery,
    SessionQuery,
    WindowKeyQuery,
    WindowRangeQuery,
    query_from_dict,
    query_types,
    register_query_type,
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
    "WindowKeyQuery",
    "WindowRangeQuery",
    "query_from_dict",
    "query_types",
    "register_query_type",
]
