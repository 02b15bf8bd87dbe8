"""The node's Flask app: health, routing metadata, and the internal per-partition query call.

The node is duck-typed (see ``Node``) so the app can be tested without Kafka or RocksDB.
Every error, including Flask's own 404/405 and unexpected exceptions, is a JSON body
``{"error": {"code", "message"}}``: callers are programs and a user reads the message.
"""

from __future__ import annotations

import hmac
import json
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

import pyarrow as pa
from flask import Flask, Response, jsonify, request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from werkzeug.exceptions import HTTPException

from federator.metrics import Metrics
from federator.query.queries import UnknownQueryType
from federator.query.request import StateQueryRequest
from federator.query.result import FailureReason, QueryResult
from federator.auth import Users
from federator.http.bearer_auth import BearerAuth
from federator.http.console import register_console
from federator.http.sql_routes import SqlNode, register_sql_routes
from federator.query.wire import MEDIA_TYPE, SECRET_HEADER, encode_results

if TYPE_CHECKING:
    from federator.plugin.registry import Registry


class Node(Protocol):
    """What the app needs from a node."""

    node_id: str
    state: str
    cluster_secret: str | None

    def execute(self, request: StateQueryRequest) -> list[QueryResult]: ...
    def schema_for(self, store: str) -> pa.Schema | None: ...
    def metadata(self) -> dict: ...
    def key_metadata(self, store: str, key: str) -> dict: ...
    def ready(self) -> tuple[bool, list[str]]: ...


class ApiError(Exception):
    """An error answered as JSON with an HTTP status and a stable code."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


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


def error_response(status: int, code: str, message: str) -> Response:
    resp = jsonify({"error": {"code": code, "message": message}})
    resp.status_code = status
    return resp


def _bad_request(message: str) -> NoReturn:
    raise ApiError(400, "BAD_REQUEST", message)


def _unknown_store(store: str) -> ApiError:
    return ApiError(
        404, "UNKNOWN_STORE", f"unknown store {store!r}; `federator store list` shows the stores of this application"
    )


def _as_bytes(s: str) -> bytes:
    # WSGI hands headers over as latin-1 decoded text; undo that to compare the raw bytes sent.
    try:
        return s.encode("latin-1")
    except UnicodeEncodeError:
        return s.encode("utf-8")


def _check_secret(secret: str) -> None:
    given = request.headers.get(SECRET_HEADER)
    if given is None:
        raise ApiError(
            403, "FORBIDDEN", f"internal endpoints need the cluster secret: pass it in the {SECRET_HEADER} header"
        )
    # compare_digest so the time taken does not reveal how much of the secret was right.
    if not hmac.compare_digest(_as_bytes(given), secret.encode("utf-8")):
        raise ApiError(
            403,
            "FORBIDDEN",
            f"the {SECRET_HEADER} header does not match this node's cluster secret; "
            "pass the cluster secret every node of the application was started with",
        )


def _read_json_object() -> dict[str, Any]:
    raw = request.get_data(cache=False)
    if not raw:
        _bad_request("the request body is empty; send a StateQueryRequest as JSON (StateQueryRequest.to_dict())")
    try:
        body = json.loads(raw)
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are both ValueErrors
        _bad_request(f"the request body is not valid JSON: {e}")
    if not isinstance(body, dict):
        _bad_request(f"the request body must be a JSON object (a StateQueryRequest), not {type(body).__name__}")
    return body


def _describe(e: Exception) -> str:
    if isinstance(e, KeyError):  # str(KeyError) is just the quoted key
        return f"missing field {e.args[0]!r}" if e.args else "missing field"
    return str(e) or type(e).__name__


def _partitions_field(body: dict[str, Any]) -> list[int] | None:
    parts = body.get("partitions")
    if parts is None:
        return None
    if not isinstance(parts, list):
        _bad_request(f"field 'partitions' must be a list of partition numbers or null, not {parts!r}")
    try:
        return [int(p) for p in parts]
    except (TypeError, ValueError):
        _bad_request(f"field 'partitions' must hold integers, got {parts!r}")


def _check_fields(body: dict[str, Any]) -> None:
    """Shape checks that name the field; StateQueryRequest.from_dict's own errors would not."""
    store = body.get("store")
    if not isinstance(store, str) or not store:
        _bad_request(f"field 'store' must be a store name (a non-empty string), got {store!r}")
    query = body.get("query")
    if not isinstance(query, dict) or not isinstance(query.get("type"), str):
        _bad_request(f"field 'query' must be an object with a string 'type' (Query.to_dict()), got {query!r}")
    _partitions_field(body)
    bound = body.get("bound")
    if bound is not None and not (isinstance(bound, dict) and all(isinstance(v, dict) for v in bound.values())):
        _bad_request(f"field 'bound' must be null or a Position (topic -> partition -> offset), got {bound!r}")


def _unknown_type_results(body: dict[str, Any], e: UnknownQueryType) -> list[QueryResult]:
    partitions = _partitions_field(body)
    if partitions is None:
        # "All partitions", but how many the app cannot know, and a silent partial answer is worse.
        raise ApiError(422, "UNKNOWN_QUERY_TYPE", f"{e} (request for all partitions of store {body['store']!r})")
    # The node cannot run it, yet the request is well-formed: each partition says so, and the
    # caller turns that into an error that names the missing plugin.
    return [QueryResult.failed(p, FailureReason.UNKNOWN_QUERY_TYPE, str(e)) for p in partitions]


def create_app(node: Node, registry: Registry, sql: SqlNode | None = None, users: Users | None = None) -> Flask:
    """The app over ``node``; ``registry`` (the node's) names the query types requests carry;
    ``sql`` answers the SQL and store routes (tests' fake nodes answer them themselves);
    with ``users``, public requests need a bearer token of one of them (federator.http.bearer_auth)."""
    app = Flask("federator")

    @app.before_request
    def guard_internal() -> None:
        # Read the secret per request: the node owns it and the app keeps no copy.
        secret = node.cluster_secret
        if secret and (request.path == "/internal" or request.path.startswith("/internal/")):
            _check_secret(secret)

    register_console(app)

    @app.get("/healthz")
    def healthz() -> Response:
        return jsonify({"status": "up", "node_id": node.node_id, "state": node.state})

    # The node's metrics (federator.metrics): the node's own registry, or the SQL front's
    # when a test's fake node has none. Open like /healthz: Prometheus scrapes it.
    metrics = getattr(node, "metrics", None) or getattr(sql, "metrics", None) or Metrics()

    @app.get("/metrics")
    def prometheus_metrics() -> Response:
        return Response(generate_latest(metrics.registry), content_type=CONTENT_TYPE_LATEST)

    @app.get("/readyz")
    def readyz() -> tuple[Response, int]:
        ready, reasons = node.ready()
        body = {"ready": bool(ready), "node_id": node.node_id, "state": node.state, "reasons": list(reasons)}
        return jsonify(body), 200 if ready else 503

    @app.get("/v1/metadata")
    def metadata() -> Response:
        md = node.metadata()
        admission = getattr(sql, "admission", None)
        if admission is not None:  # this node's public queries: running, waiting, and the caps
            md.setdefault("local", {})["queries"] = admission.state()
        return jsonify(md)

    @app.get("/v1/metadata/stores/<store>/keys/<path:key>")
    def key_metadata(store: str, key: str) -> Response:
        try:
            return jsonify(node.key_metadata(store, key))
        except KeyError as e:
            if not e.args:
                raise _unknown_store(store) from e
            raise ApiError(404, "UNKNOWN_STORE", str(e.args[0])) from e
        except ValueError as e:
            raise ApiError(400, "INVALID_KEY", str(e) or f"key {key!r} does not parse for store {store!r}") from e

    @app.post("/internal/v1/query")
    def internal_query() -> Response:
        body = _read_json_object()
        _check_fields(body)
        schema = node.schema_for(body["store"])
        if schema is None:
            raise _unknown_store(body["store"])
        try:
            req = StateQueryRequest.from_dict(body, registry.query_types)
        except UnknownQueryType as e:  # a KeyError, so it must come before the generic catch
            results = _unknown_type_results(body, e)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            _bad_request(f"the body is not a valid StateQueryRequest: {_describe(e)}")
        else:
            results = node.execute(req)
            # SQL work at the owner, and plugin queries (counts, ranks), answer in their own shape
            schema = _pipeline_schema(results, schema)
        return Response(encode_results(results, schema), mimetype=MEDIA_TYPE)

    @app.errorhandler(ApiError)
    def api_error(e: ApiError) -> Response:
        return error_response(e.status, e.code, e.message)

    @app.errorhandler(HTTPException)
    def http_error(e: HTTPException) -> Response:
        status = e.code or 500
        if status == 404:
            message = f"no endpoint {request.method} {request.path}; see /v1/metadata, /healthz, /readyz, /metrics"
        elif status == 405:
            allowed = ", ".join(sorted(m for m in (e.valid_methods or []) if m not in ("HEAD", "OPTIONS")))  # type: ignore[attr-defined]
            message = f"{request.method} is not allowed on {request.path}; use {allowed or 'another method'}"
        else:
            message = e.description or e.name
        return error_response(status, e.name.upper().replace(" ", "_").replace("'", ""), message)

    @app.errorhandler(Exception)
    def unexpected(e: Exception) -> Response:
        app.logger.exception("unexpected error on %s %s", request.method, request.path)
        return error_response(500, "INTERNAL", f"{type(e).__name__}: {e}")

    sql = sql if sql is not None else node if hasattr(node, "sql") else None
    if sql is not None:  # a node without the SQL engine still serves the internal API
        register_sql_routes(app, sql, registry)
    if users is not None:  # outermost, so the SQL fast path is guarded too
        app.wsgi_app = BearerAuth(app.wsgi_app, users)  # type: ignore[method-assign]
    return app
