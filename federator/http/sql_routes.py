"""The public SQL endpoints: ``POST /v1/sql`` and the ``/v1/stores`` browsing routes.

Results stream in the format the caller asked for (see ``formats``). Every error is
``{"error": {"code", "message", ...}}`` with the status its code maps to (``SqlError.status``).
"""

from __future__ import annotations

import itertools
import json
import logging
import math
from typing import Any, Iterator, Protocol

import pyarrow as pa
from flask import Flask, Response, request
from werkzeug.datastructures import MIMEAccept
from werkzeug.http import parse_accept_header
from werkzeug.wsgi import get_input_stream

from federator.http.formats import MEDIA_TYPES, body_chunks, choose_format, json_rows_body, jsonable
from federator.sql.errors import SqlError
from federator.sql.result import SqlRequest, SqlResult

TOKEN_HEADER = "X-Federator-Consistency-Token"
_log = logging.getLogger("federator.http")

# Body fields and their defaults; anything else is refused so a misspelt option
# ("paramters") fails instead of being silently ignored.
_FIELDS = ("sql", "parameters", "consistency_token", "allow_stale", "max_lag", "timeout_ms", "format")


class SqlNode(Protocol):
    """What the SQL routes need from a node."""

    def sql(self, request: SqlRequest) -> SqlResult: ...
    def stores_info(self) -> list[dict]: ...
    def store_info(self, name: str) -> dict: ...
    def lookup(self, store: str, key: str) -> dict | None: ...


def _invalid(field: str, message: str) -> SqlError:
    return SqlError("INVALID_PARAMETER", f"field {field!r} {message}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)  # JSON true is not a number


def sql_request_from_body(body: Any) -> tuple[SqlRequest, Any]:
    """The SqlRequest and the requested format from a decoded body; SqlError names a bad field."""
    if not isinstance(body, dict):
        raise SqlError("INVALID_PARAMETER",
                       f'the request body must be a JSON object like {{"sql": "SELECT ..."}}, not {type(body).__name__}')
    unknown = sorted(set(body) - set(_FIELDS))
    if unknown:
        raise SqlError("INVALID_PARAMETER", f"unknown field(s) {', '.join(map(repr, unknown))}; the fields are {', '.join(_FIELDS)}")
    sql = body.get("sql")
    if not isinstance(sql, str) or not sql.strip():
        raise _invalid("sql", f"must be a non-empty string holding one SQL statement, got {sql!r}")
    params = body.get("parameters")
    if params is None:
        params = []
    elif not isinstance(params, list):
        raise _invalid("parameters", f"must be a list of values for the ? placeholders, got {params!r}")
    token = body.get("consistency_token")
    if token is not None and not isinstance(token, str):
        raise _invalid("consistency_token", f"must be null or a token string from an earlier answer, got {token!r}")
    allow_stale = body.get("allow_stale", False)
    if not isinstance(allow_stale, bool):
        raise _invalid("allow_stale", f"must be true or false, got {allow_stale!r}")
    max_lag = body.get("max_lag")
    if max_lag is not None and not (_is_int(max_lag) and max_lag >= 0):
        raise _invalid("max_lag", f"must be null or a non-negative integer (records behind), got {max_lag!r}")
    timeout_ms = body.get("timeout_ms", 10_000)
    if not (_is_int(timeout_ms) and timeout_ms > 0):
        raise _invalid("timeout_ms", f"must be a positive integer number of milliseconds, got {timeout_ms!r}")
    req = SqlRequest(sql=sql, parameters=params, consistency_token=token, allow_stale=allow_stale,
                     max_lag=max_lag, timeout_ms=timeout_ms)
    return req, body.get("format")


def _read_body(environ: dict[str, Any]) -> Any:
    length = environ.get("CONTENT_LENGTH")
    if length and not environ.get("HTTP_TRANSFER_ENCODING"):
        raw = environ["wsgi.input"].read(int(length))
    else:
        raw = get_input_stream(environ).read()  # chunked (the server has de-chunked it) or no length
    if not raw:
        raise SqlError("INVALID_PARAMETER", 'the request body is empty; send a JSON object like {"sql": "SELECT ..."}')
    try:
        return json.loads(raw)
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError alike
        raise SqlError("INVALID_PARAMETER", f"the request body is not valid JSON: {e}") from e


def sql_error_response(err: SqlError) -> Response:
    resp = json_response(err.to_dict(), err.status)
    if err.retry_after is not None:
        # Retry-After takes whole seconds; 0 would invite an immediate retry storm.
        resp.headers["Retry-After"] = str(max(1, math.ceil(err.retry_after)))
    return resp


def json_response(obj: Any, status: int = 200) -> Response:
    """JSON in the SQL value conventions (Flask's jsonify would write dates as RFC 822)."""
    return Response(json.dumps(jsonable(obj), ensure_ascii=False, separators=(",", ":")),
                    status=status, mimetype="application/json")


def _batches(first: pa.RecordBatch | None, rest: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    if first is not None:
        yield first
    yield from rest


def _closing(chunks: Iterator[bytes], *sources: Any) -> Iterator[bytes]:
    # The server closes the body when the client goes away; pass that on so the engine
    # can stop fetching partitions nobody will read.
    try:
        yield from chunks
    finally:
        for src in sources:
            close = getattr(src, "close", None)
            if close is not None:
                close()


SMALL_BODY = 64 * 1024
_JSON_ACCEPTS = (None, "", "*/*", "application/json")


def _whole_if_small(chunks: Iterator[bytes]) -> bytes | Iterator[bytes]:
    """A small answer as one body with a Content-Length; a large one streamed as it comes.

    Streaming makes the server send chunked encoding with a write per piece, which for a
    point query costs more than the query itself."""
    head: list[bytes] = []
    size = 0
    for chunk in chunks:
        head.append(chunk)
        size += len(chunk)
        if size > SMALL_BODY:
            return itertools.chain(head, chunks)
    return b"".join(head)


class _JsonBody:
    """A whole JSON answer as a bare WSGI app: building a Werkzeug Response and running it
    cost more than the point query it carries."""

    __slots__ = ("body",)

    def __init__(self, body: bytes) -> None:
        self.body = body

    def __call__(self, environ: dict[str, Any], start_response: Any) -> list[bytes]:
        start_response("200 OK", [("Content-Type", MEDIA_TYPES["json"]), ("Content-Length", str(len(self.body)))])
        return [self.body]


def sql_response(node: SqlNode, environ: dict[str, Any]) -> Response | _JsonBody:
    """The answer to a ``POST /v1/sql`` (errors included) from its WSGI environ."""
    try:
        req, requested = sql_request_from_body(_read_body(environ))
        accept = environ.get("HTTP_ACCEPT")
        # the common headers need no parsing (Werkzeug's Accept matching costs ~50 us a request)
        fmt = choose_format(requested, None if accept in _JSON_ACCEPTS else parse_accept_header(accept, MIMEAccept))
        result = node.sql(req)
        if fmt == "json" and result.rows is not None:
            body = json_rows_body(result.schema, result.rows,
                                  {"consistency_token": result.consistency_token, "stats": result.stats})
            if body is not None:
                return _JsonBody(body)
        rest = iter(result.batches)
        # Pull the first batch before answering: most failures (unreachable partitions,
        # timeouts, bad plans found late) surface here and can still get their real status.
        first = next(rest, None)
        token = result.consistency_token
        headers = {TOKEN_HEADER: token} if fmt != "json" and token else {}

        def trailer() -> dict[str, Any]:
            return {"consistency_token": result.consistency_token, "stats": result.stats}

        chunks = _closing(body_chunks(fmt, result.schema, _batches(first, rest), trailer), rest)
        return Response(_whole_if_small(chunks), mimetype=MEDIA_TYPES[fmt], headers=headers)
    except SqlError as e:
        return sql_error_response(e)
    except Exception as e:  # noqa: BLE001 - the same JSON 500 the app gives for any other route
        _log.exception("unexpected error on POST /v1/sql")
        return json_response({"error": {"code": "INTERNAL", "message": f"{type(e).__name__}: {e}"}}, 500)


class SqlFastPath:
    """WSGI middleware that answers ``POST /v1/sql`` before Flask sees it.

    Flask's request context, URL matching and session handling cost more CPU than a point
    query itself (about 400 us against 150 us here); the SQL endpoint needs none of them.
    Every other request, ``GET /v1/sql`` included (Flask's 405), goes on to the app."""

    def __init__(self, app: Any, node: SqlNode) -> None:
        self.app, self.node = app, node

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get("PATH_INFO") == "/v1/sql" and environ.get("REQUEST_METHOD") == "POST":
            return sql_response(self.node, environ)(environ, start_response)
        return self.app(environ, start_response)


def register_sql_routes(app: Flask, node: SqlNode) -> None:
    app.register_error_handler(SqlError, sql_error_response)
    app.wsgi_app = SqlFastPath(app.wsgi_app, node)  # type: ignore[method-assign]

    @app.post("/v1/sql")
    def sql() -> Response:
        # reached only when the app runs without SqlFastPath (which answers POSTs first)
        return sql_response(node, request.environ)

    @app.get("/v1/plugins")
    def plugins() -> Response:
        from dataclasses import asdict

        from federator.plugin.manager import installed_plugins

        return json_response({"plugins": [asdict(p) for p in installed_plugins()]})

    @app.get("/v1/stores")
    def stores() -> Response:
        return json_response({"stores": list(node.stores_info())})

    @app.get("/v1/stores/<name>")
    def store(name: str) -> Response:
        return json_response(node.store_info(name))

    @app.get("/v1/stores/<name>/keys/<path:key>")
    def lookup(name: str, key: str) -> Response:
        row = node.lookup(name, key)
        if row is None:
            return json_response({"error": {"code": "KEY_NOT_FOUND", "message": f"store {name!r} has no key {key!r}",
                                            "store": name, "key": key}}, 404)
        return json_response(row)
