"""The node's Flask app: health, routing metadata, and the internal per-partition query call.

The node is duck-typed (see ``Node``) so the app can be tested without Kafka or RocksDB.
Every error, including Flask's own 404/405 and unexpected exceptions, is a JSON body
``{"error": {"code", "message"}}`` from its code's row (federator.errors): callers are
programs and a user reads the message.
"""

from __future__ import annotations

import hmac
import logging
from typing import TYPE_CHECKING, Protocol

import pyarrow as pa
from flask import Flask, Response, jsonify, request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from werkzeug.exceptions import HTTPException, MethodNotAllowed

from federator.errors import FederatorError, SqlError
from federator.metrics import Metrics
from federator.node import internal_query as internal
from federator.query.request import StateQueryRequest
from federator.query.result import QueryResult
from federator.auth import Users
from federator.http.bearer_auth import BearerAuth
from federator.http.console import register_console
from federator.http.errors import error_response
from federator.http.openapi import document as openapi_document
from federator.http.sql_routes import SqlNode, register_sql_routes
from federator.query.wire import MEDIA_TYPE, SECRET_HEADER

if TYPE_CHECKING:
    from federator.plugin.registry import Registry

_log = logging.getLogger(__name__)


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


# Werkzeug's own refusals (no route, a method the route does not take) by their HTTP status;
# any other 4xx it raises is a request the protocol does not expect
_HTTP_CODES = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED", 413: "REQUEST_TOO_LARGE"}


def _unknown_store(store: str) -> SqlError:
    return SqlError("UNKNOWN_STORE", f"unknown store {store!r}; `federator store list` shows the stores of this application")


def _as_bytes(s: str) -> bytes:
    # WSGI hands headers over as latin-1 decoded text; undo that to compare the raw bytes sent.
    try:
        return s.encode("latin-1")
    except UnicodeEncodeError:
        return s.encode("utf-8")


def _check_secret(secret: str) -> None:
    given = request.headers.get(SECRET_HEADER)
    if given is None:
        _log.warning("an internal call from %s without the cluster secret was refused", request.remote_addr)
        raise SqlError("FORBIDDEN", f"internal endpoints need the cluster secret: pass it in the {SECRET_HEADER} header")
    # compare_digest so the time taken does not reveal how much of the secret was right.
    if not hmac.compare_digest(_as_bytes(given), secret.encode("utf-8")):
        _log.warning("an internal call from %s with a wrong cluster secret was refused", request.remote_addr)
        raise SqlError(
            "FORBIDDEN",
            f"the {SECRET_HEADER} header does not match this node's cluster secret; "
            "pass the cluster secret every node of the application was started with",
        )


def create_app(node: Node, registry: Registry, sql: SqlNode | None = None, users: Users | None = None) -> Flask:
    """The app over ``node``; ``registry`` (the node's) names the query types requests carry;
    ``sql`` answers the SQL and store routes (tests' fake nodes answer them themselves);
    with ``users``, public requests need a bearer token of one of them (federator.http.bearer_auth)."""
    app = Flask("federator")
    sql = sql if sql is not None else node if hasattr(node, "sql") else None
    _node_routes(app, node, registry, sql)
    _error_handlers(app)
    if sql is not None:  # a node without the SQL engine still serves the internal API
        register_sql_routes(app, sql, registry)
    if users is not None:  # outermost, so the SQL fast path is guarded too
        app.wsgi_app = BearerAuth(app.wsgi_app, users)  # type: ignore[method-assign]
    return app


def _node_routes(app: Flask, node: Node, registry: Registry, sql: SqlNode | None) -> None:
    """The node's own routes: health, metrics, metadata, the internal query; the console."""
    @app.before_request
    def guard_internal() -> None:
        # Read the secret per request: the node owns it and the app keeps no copy.
        secret = node.cluster_secret
        if secret and (request.path == "/internal" or request.path.startswith("/internal/")):
            _check_secret(secret)

    register_console(app)

    @app.get("/openapi.json")
    def openapi() -> Response:
        return jsonify(openapi_document())

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
            raise SqlError("UNKNOWN_STORE", str(e.args[0])) from e
        except ValueError as e:
            raise SqlError("INVALID_KEY", str(e) or f"key {key!r} does not parse for store {store!r}") from e

    @app.post("/internal/v1/query")
    def internal_query() -> Response:
        body = internal.answer(node, registry.query_types, internal.parse_body(request.get_data(cache=False)))
        return Response(body, mimetype=MEDIA_TYPE)


def _error_handlers(app: Flask) -> None:
    """Every error as the one error body: Federator's, HTTP's (no such route, method), any other."""
    app.register_error_handler(FederatorError, error_response)

    @app.errorhandler(HTTPException)
    def http_error(e: HTTPException) -> Response:
        status = e.code or 500
        if status == 404:
            message = f"no endpoint {request.method} {request.path}; see /v1/metadata, /healthz, /readyz, /metrics"
        elif isinstance(e, MethodNotAllowed):
            allowed = ", ".join(sorted(m for m in (e.valid_methods or []) if m not in ("HEAD", "OPTIONS")))
            message = f"{request.method} is not allowed on {request.path}; use {allowed or 'another method'}"
        else:
            message = e.description or e.name
        code = _HTTP_CODES.get(status) or ("BAD_REQUEST" if status < 500 else "INTERNAL")
        return error_response(SqlError(code, message))

    @app.errorhandler(Exception)
    def unexpected(e: Exception) -> Response:
        app.logger.exception("unexpected error on %s %s", request.method, request.path)
        return error_response(e)
