"""A node's answer to another node's per-partition query (a StateQueryRequest as JSON): the
results as an Arrow IPC result stream (federator.query.wire). The same answer goes out over
HTTP (``POST /internal/v1/query``) and over the node's call port (federator.node.key_server)."""

from __future__ import annotations

import json
from typing import Any, Mapping

import pyarrow as pa

from federator.errors import SqlError
from federator.query.queries import UnknownQueryType
from federator.query.request import StateQueryRequest
from federator.query.result import FailureReason, QueryResult
from federator.query.wire import encode_results


def _bad(message: str) -> SqlError:
    return SqlError("BAD_REQUEST", message)


def parse_body(raw: bytes) -> dict[str, Any]:
    if not raw:
        raise _bad("the request body is empty; send a StateQueryRequest as JSON (StateQueryRequest.to_dict())")
    try:
        body = json.loads(raw)
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are both ValueErrors
        raise _bad(f"the request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise _bad(f"the request body must be a JSON object (a StateQueryRequest), not {type(body).__name__}")
    return body


def answer(node: Any, query_types: Mapping[str, Any], body: dict[str, Any]) -> bytes:
    """The result stream for ``body``; SqlError for a request it cannot take."""
    _check_fields(body)
    schema = node.schema_for(body["store"])
    if schema is None:
        raise SqlError("UNKNOWN_STORE", f"unknown store {body['store']!r}; `federator store list` "
                                                       "shows the stores of this application")
    try:
        req = StateQueryRequest.from_dict(body, query_types)
    except UnknownQueryType as e:  # a KeyError, so it must come before the generic catch
        results = _unknown_type_results(body, e)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise _bad(f"the body is not a valid StateQueryRequest: {_describe(e)}") from None
    else:
        results = node.execute(req)
        # SQL work at the owner, and plugin queries (counts, ranks), answer in their own shape
        schema = _pipeline_schema(results, schema)
    return encode_results(results, schema)


def _describe(e: Exception) -> str:
    if isinstance(e, KeyError):  # str(KeyError) is just the quoted key
        return f"missing field {e.args[0]!r}" if e.args else "missing field"
    return str(e) or type(e).__name__


def _partitions_field(body: dict[str, Any]) -> list[int] | None:
    parts = body.get("partitions")
    if parts is None:
        return None
    if not isinstance(parts, list):
        raise _bad(f"field 'partitions' must be a list of partition numbers or null, not {parts!r}")
    try:
        return [int(p) for p in parts]
    except (TypeError, ValueError):
        raise _bad(f"field 'partitions' must hold integers, got {parts!r}") from None


def _check_fields(body: dict[str, Any]) -> None:
    """Shape checks that name the field; StateQueryRequest.from_dict's own errors would not."""
    store = body.get("store")
    if not isinstance(store, str) or not store:
        raise _bad(f"field 'store' must be a store name (a non-empty string), got {store!r}")
    query = body.get("query")
    if not isinstance(query, dict) or not isinstance(query.get("type"), str):
        raise _bad(f"field 'query' must be an object with a string 'type' (Query.to_dict()), got {query!r}")
    _partitions_field(body)
    bound = body.get("bound")
    if bound is not None and not (isinstance(bound, dict) and all(isinstance(v, dict) for v in bound.values())):
        raise _bad(f"field 'bound' must be null or a Position (topic -> partition -> offset), got {bound!r}")


def _unknown_type_results(body: dict[str, Any], e: UnknownQueryType) -> list[QueryResult]:
    partitions = _partitions_field(body)
    if partitions is None:
        # "All partitions", but how many the node cannot know, and a silent partial answer is worse.
        raise SqlError("UNKNOWN_QUERY_TYPE", f"{e} (request for all partitions of store {body['store']!r})")
    # The node cannot run it, yet the request is well-formed: each partition says so, and the
    # caller turns that into an error that names the missing plugin.
    return [QueryResult.failed(p, FailureReason.UNKNOWN_QUERY_TYPE, str(e)) for p in partitions]


def _pipeline_schema(results: list[QueryResult], store_schema: pa.Schema) -> pa.Schema:
    """The stream takes the first answer's schema, and the others are cast to it (an empty
    partition may have inferred looser types)."""
    ok = [r for r in results if r.ok and r.batch is not None]
    if not ok:
        return store_schema
    schema = ok[0].batch.schema
    for r in ok[1:]:
        if not r.batch.schema.equals(schema):
            r.batch = r.batch.cast(schema)
    return schema
