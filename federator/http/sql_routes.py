"""The public SQL endpoints: ``POST /v1/sql`` and the ``/v1/stores`` browsing routes.

Results stream in the format the caller asked for (see ``formats``). Every error is
``{"error": {"code", "message", ...}}`` with the status its code maps to (federator.http.errors).
"""

from __future__ import annotations

import itertools
import json
import logging
import reprlib
from collections.abc import Awaitable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Callable, Coroutine, Iterator, Protocol

import orjson
from flask import Flask, Response, request
from werkzeug.datastructures import MIMEAccept
from werkzeug.http import parse_accept_header
from werkzeug.wsgi import get_input_stream

from federator.http.errors import error_response
from federator.http.formats import MEDIA_TYPES, body_chunks, choose_format, json_object_body, json_object_from_arrow, json_rows_body, jsonable
from federator.http.wsgi_bridge import Request, Whole
from federator.errors import FederatorError, SqlError
from federator.sql.limits import (DEFAULT_LIMITS, DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_TIMEOUT_MS, Limits,
                                  Slot, admit, limits_of)
from federator.sql.result import SqlRequest, SqlResult

if TYPE_CHECKING:
    from federator.plugin.registry import Registry
    from federator.sql.engine import RoutedPoint

TOKEN_HEADER = "X-Federator-Consistency-Token"
_log = logging.getLogger("federator.http")

# Body fields and their defaults; anything else is refused so a misspelt option
# ("paramters") fails instead of being silently ignored.
_FIELDS = ("sql", "parameters", "consistency_token", "allow_stale", "max_lag", "timeout_ms", "format", "dialect")
_FIELD_SET = frozenset(_FIELDS)
# Bounds on a request, by default; a node's own come from its flags (federator.sql.limits). The
# SQL text has its own (--max-sql-chars, 1 MiB); the body also carries the parameters and JSON
# escapes, hence the larger cap.
MAX_BODY_BYTES = DEFAULT_MAX_BODY_BYTES
MAX_TIMEOUT_MS = DEFAULT_MAX_TIMEOUT_MS
_INT64_MAX = 2**63 - 1


class SqlNode(Protocol):
    """What the SQL routes need from a node."""

    def sql(self, request: SqlRequest) -> SqlResult: ...
    def stores_info(self) -> list[dict]: ...
    def store_info(self, name: str) -> dict: ...
    def lookup(self, store: str, key: str) -> SqlResult: ...


def _invalid(field: str, message: str) -> SqlError:
    return SqlError("INVALID_PARAMETER", f"field {field!r} {message}")


_SHOWN = reprlib.Repr()
_SHOWN.maxstring = _SHOWN.maxother = 80


def _shown(v: Any) -> str:
    """A value for an error message, cut short: a hostile body can be megabytes, or deep."""
    return _SHOWN.repr(v)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)  # JSON true is not a number


def _check_text(field: str, text: str) -> None:
    """JSON can carry half of a UTF-16 surrogate pair ("\\ud800"), which is no Unicode text."""
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise _invalid(field, f"holds an unpaired UTF-16 surrogate (\\u{ord(text[e.start]):04x}) at character "
                              f"{e.start}; a character beyond U+FFFF is escaped as a pair such as \\ud83d\\ude00") from None


def sql_request_from_body(body: Any, limits: Limits = DEFAULT_LIMITS) -> tuple[SqlRequest, Any]:
    """The SqlRequest and the requested format from a decoded body; SqlError names a bad field.
    A timeout_ms over ``limits.max_timeout_ms`` is clamped to it (``timeout_capped`` tells)."""
    if not isinstance(body, dict):
        raise SqlError("INVALID_PARAMETER",
                       f'the request body must be a JSON object like {{"sql": "SELECT ..."}}, not {type(body).__name__}')
    if not body.keys() <= _FIELD_SET:
        unknown = sorted(set(body) - _FIELD_SET)
        raise SqlError("INVALID_PARAMETER", f"unknown field(s) {_shown(unknown)[1:-1]}; the fields are {', '.join(_FIELDS)}")
    sql = body.get("sql")
    if not isinstance(sql, str) or not sql.strip():
        raise _invalid("sql", f"must be a non-empty string holding one SQL statement, got {_shown(sql)}")
    _check_text("sql", sql)
    params = body.get("parameters")
    if params is None:
        params = []
    elif not isinstance(params, list):
        raise _invalid("parameters", f"must be a list of values for the ? placeholders, got {_shown(params)}")
    for i, value in enumerate(params):
        if isinstance(value, str):
            _check_text(f"parameters[{i}]", value)
    token = body.get("consistency_token")
    if token is not None and not isinstance(token, str):
        raise _invalid("consistency_token", f"must be null or a token string from an earlier answer, got {_shown(token)}")
    if token is not None:
        _check_text("consistency_token", token)
    allow_stale = body.get("allow_stale", False)
    if not isinstance(allow_stale, bool):
        raise _invalid("allow_stale", f"must be true or false, got {_shown(allow_stale)}")
    max_lag = body.get("max_lag")
    if max_lag is not None and not (_is_int(max_lag) and 0 <= max_lag <= _INT64_MAX):
        raise _invalid("max_lag", f"must be null or an integer from 0 to {_INT64_MAX} (records behind), got {_shown(max_lag)}")
    timeout_ms = body.get("timeout_ms", 10_000)
    if not (_is_int(timeout_ms) and 0 < timeout_ms):
        raise _invalid("timeout_ms", f"must be a whole number of milliseconds, 1 or more (more than this node's "
                                     f"--max-timeout-ms, {limits.max_timeout_ms}, runs with that), got {_shown(timeout_ms)}")
    timeout_ms = limits.timeout_ms(timeout_ms)[0]
    dialect = body.get("dialect")
    if dialect is not None and not (isinstance(dialect, str) and dialect.strip()):
        raise _invalid("dialect", f"must be null (DuckDB's SQL) or the name of a SQL dialect such as \"postgres\", "
                                  f"got {_shown(dialect)}")
    req = SqlRequest(sql=sql, parameters=params, consistency_token=token, allow_stale=allow_stale,
                     max_lag=max_lag, timeout_ms=timeout_ms, dialect=dialect)
    return req, body.get("format")


def timeout_capped(body: Any, req: SqlRequest) -> int | None:
    """The timeout_ms a body asked for, when the node ran it with less (its --max-timeout-ms)."""
    asked = body.get("timeout_ms") if isinstance(body, dict) else None
    return asked if _is_int(asked) and asked > req.timeout_ms else None


DRAIN_MAX = 4 << 20  # bytes of a refused body read and dropped so the client hears the 413


def _drain(stream: Any, length: int) -> None:
    """Read and drop a refused body (up to DRAIN_MAX), a chunk at a time: a server that answers
    and closes while the client still sends makes the client's TCP stack see a reset, and the
    client reports a broken connection instead of the 413. Past the bound
    the connection is closed unread, as before."""
    left = min(length, DRAIN_MAX)
    while left > 0:
        chunk = stream.read(min(left, 1 << 16))
        if not chunk:
            return
        left -= len(chunk)


def _holds_float(value: Any) -> bool:
    """Whether a decoded JSON value holds a float anywhere: orjson reads an integer past 64
    bits as one, so a body that does is read again by the json module, exactly (looking over
    the few decoded values costs less than scanning the body's bytes for long numbers)."""
    kind = type(value)
    if kind is float:
        return True
    if kind is dict:
        value = value.values()
    elif kind is not list:
        return False
    for item in value:  # a call only for what nests: most bodies hold strings
        held = type(item)
        if held is float or ((held is dict or held is list) and _holds_float(item)):
            return True
    return False


def _read_body(environ: dict[str, Any], limits: Limits = DEFAULT_LIMITS) -> Any:
    length = environ.get("CONTENT_LENGTH")
    cap = limits.max_body_bytes
    if length and not environ.get("HTTP_TRANSFER_ENCODING"):
        if not length.isdigit():
            raise SqlError("INVALID_PARAMETER", f"the Content-Length header {length[:40]!r} is not a number of bytes")
        if int(length) > cap:
            _drain(environ["wsgi.input"], int(length))
            raise limits.body_too_large(f"{int(length):,}")
        raw = environ["wsgi.input"].read(int(length))
    else:  # chunked (the server has de-chunked it) or no length
        raw = get_input_stream(environ).read(cap + 1)
        if len(raw) > cap:
            raise limits.body_too_large(f"more than {cap:,}")
    return _decoded(raw)


def _decoded(raw: bytes) -> Any:
    """A request body's JSON; SqlError says what is wrong with it."""
    if not raw:
        raise SqlError("INVALID_PARAMETER", 'the request body is empty; send a JSON object like {"sql": "SELECT ..."}')
    if raw[:1] == b"{":
        try:  # an object in UTF-8, as nearly every client sends: read in C
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = None  # the json module accepts more (NaN) and says what is wrong as it always has
        if body is not None and not _holds_float(body):
            return body
    try:
        # an object in UTF-8 skips json's guess at the encoding
        return json.loads(raw.decode() if raw[:1] == b"{" and raw[1:2] != b"\x00" else raw)
    except UnicodeDecodeError as e:
        raise SqlError("INVALID_PARAMETER", f"the request body is not valid JSON: byte 0x{raw[e.start]:02x} at {e.start} is not UTF-8 "
                                            "(send JSON encoded as UTF-8)") from None
    except ValueError as e:  # JSONDecodeError
        raise SqlError("INVALID_PARAMETER", f"the request body is not valid JSON: {e}") from e
    except RecursionError:  # the C decoder stops at the recursion limit, before any harm
        raise SqlError("INVALID_PARAMETER", "the request body nests JSON arrays or objects too deeply; "
                                            'send a flat object like {"sql": "SELECT ...", "parameters": [1, "a"]}') from None


def json_response(obj: Any, status: int = 200) -> Response:
    """JSON in the SQL value conventions (Flask's jsonify would write dates as RFC 822)."""
    return Response(json.dumps(jsonable(obj), ensure_ascii=False, separators=(",", ":")),
                    status=status, mimetype="application/json")


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


class _JsonBody(Whole):
    """A whole JSON answer, without a Werkzeug Response: building one and running it cost more
    than the point query it carries."""

    __slots__ = ()

    def __init__(self, body: bytes) -> None:
        self.status, self.body = "200 OK", body
        self.headers = [("Content-Type", _JSON), ("Content-Length", str(len(body)))]


_JSON = MEDIA_TYPES["json"]


def sql_response(node: SqlNode, environ: dict[str, Any]) -> Response | _JsonBody:
    """The answer to a ``POST /v1/sql`` (errors included) from its WSGI environ."""
    limits = limits_of(node)
    slot: Slot | None = None
    capped_from: int | None = None
    streaming = False
    try:
        req, fmt, capped_from = _sql_request(environ, limits)
        slot = admit(node, req.timeout_ms / 1000)  # held until the answer is sent (see below)
        if slot is not None:
            slot.charge(req)
        answer, streaming = _sql_answer(node.sql(req), fmt, limits, slot, capped_from)
        return answer
    except SqlError as e:
        return error_response(limits.timed_out(e) if capped_from is not None else e)
    except RecursionError:
        # a planner or evaluator recursing over a deep expression tree (a chain of hundreds of
        # OR or + terms): the SQL is valid but more than this engine can take
        _log.warning("POST /v1/sql: the statement recursed too deeply", exc_info=True)
        return error_response(SqlError("SQL_PARSE_ERROR", "the SQL is nested too deeply to plan (a long chain of "
                                                              "AND/OR or arithmetic terms?); simplify it, for example "
                                                              "with IN (...) instead of a chain of ORs"))
    except OverflowError as e:
        # a number too large for a 64-bit integer reached a conversion (LIMIT 9223372036854775808)
        _log.warning("POST /v1/sql: a number out of range", exc_info=True)
        return error_response(SqlError("INVALID_DATA", f"a number in the SQL or its parameters is out of range "
                                                           f"({e}); LIMIT, OFFSET and integers must fit in 64 bits"))
    except Exception as e:  # noqa: BLE001 - the same JSON 500 the app gives for any other route
        _log.exception("unexpected error on POST /v1/sql")
        return error_response(e)
    finally:
        if slot is not None and not streaming:
            slot.release()


def sql_at_once(node: SqlNode, http: Request) -> Response | _JsonBody | Coroutine[Any, Any, Any] | None:
    """``sql_response``'s answer given on the calling thread's event loop (the loop server's):
    for a JSON query without a consistency token that this node answers at once
    (``answer_now``: a point query it reads from its own copy, a kept answer still current, a
    leaderboard's rank on a global store) while a query slot is free; or what gives it on the
    loop, for a point query whose key another node owns (a RoutedPoint, see ``_from_owner``).
    None for any other request, which ``sql_response`` answers (the same way: the same
    functions make both answers), from what this read of it (``Request.hand_on``)."""
    now = getattr(node, "answer_now", None)
    if now is None:
        return None
    limits = limits_of(node)
    try:  # (the loop refused a body over the cap before it was read: LoopAnswers.body_cap)
        read = _sql_request_of(_decoded(bytes(http.body)), http.header(b"accept"), limits)
    except SqlError:
        return None  # sql_response gives the error
    got = _sql_now(node, now, read, limits)
    if got is None or isinstance(got, Awaitable):  # a thread may answer it
        http.hand_on(_READ, read)
    return got


def _sql_now(node: SqlNode, now: Callable[[SqlRequest], SqlResult | RoutedPoint | None],
             read: tuple[SqlRequest, str, int | None], limits: Limits) -> Response | _JsonBody | Coroutine[Any, Any, Any] | None:
    """``sql_at_once``'s answer to the request as read (``_sql_request``)."""
    req, fmt, capped_from = read
    if fmt != "json" or capped_from is not None:
        return None
    with _slot_now(node) as slot:
        if slot is False:
            return None
        try:
            got = now(req)
        except SqlError as e:  # as sql_response answers it (the engine counted it)
            return error_response(e)
        if got is None:
            return None
        if isinstance(got, SqlResult):
            return _sql_json_now(got, limits, slot or None)
    return _from_owner(got, lambda result: _sql_json_now(result, limits, None))


def _sql_json_now(result: SqlResult, limits: Limits, slot: Slot | None) -> Response | _JsonBody:
    """A JSON answer made whole on the loop (small: a point's, or a kept one within its cap)."""
    try:
        return _sql_answer(result, "json", limits, slot, None)[0]
    except SqlError as e:  # an answer over a cap, as sql_response answers it
        return error_response(e)


async def _from_owner(routed: RoutedPoint, answer: Callable[[SqlResult], Response | _JsonBody]) -> Response | _JsonBody | None:
    """The answer from the entry the key's owner gives, awaited on the event loop; None when the
    owner could not answer so (the route answers on a thread). Admitted as the answers given at
    once are (a query slot was free when it came), it holds no slot while it waits: it runs no
    Python meanwhile (a slot held across the wait would send the next queries to the threads,
    and there wait in the queue)."""
    result = await routed.answer()
    return None if result is None else answer(result)


class _slot_now:
    """A query slot of the node's admission free now, given back after the block; the block
    sees the Slot, None (the node has no admission) or False (none free: the query would wait).
    A class, not a generator: it is entered on every request the loop answers."""

    __slots__ = ("admission", "slot")

    def __init__(self, node: SqlNode) -> None:
        self.admission = getattr(node, "admission", None)
        self.slot: Slot | None = None

    def __enter__(self) -> Slot | None | bool:
        if self.admission is None:
            return None
        self.slot = self.admission.try_enter()
        return False if self.slot is None else self.slot

    def __exit__(self, *exc: Any) -> None:
        if self.slot is not None:
            self.slot.release()


_READ = "federator.sql_request"  # the environ's request as read: the loop's, for the thread that answers after it


def _sql_request(environ: dict[str, Any], limits: Limits) -> tuple[SqlRequest, str, int | None]:
    """A ``POST /v1/sql``'s request, its answer's format and the timeout_ms it asked for when
    that was capped; SqlError says what is wrong with it. Read once a request: a statement the
    loop could not answer at once is answered on a thread from what the loop read."""
    read = environ.get(_READ)
    if read is None:
        read = environ[_READ] = _sql_request_of(_read_body(environ, limits), environ.get("HTTP_ACCEPT"), limits)
    return read


def _sql_request_of(body: Any, accept: str | None, limits: Limits) -> tuple[SqlRequest, str, int | None]:
    """``_sql_request`` from the decoded body and the Accept header."""
    req, requested = sql_request_from_body(body, limits)
    capped_from = timeout_capped(body, req)
    limits.check_sql(req.sql)
    # the common headers need no parsing (Werkzeug's Accept matching costs ~50 us a request)
    fmt = choose_format(requested, None if accept in _JSON_ACCEPTS else parse_accept_header(accept, MIMEAccept))
    return req, fmt, capped_from


def _sql_answer(result: SqlResult, fmt: str, limits: Limits, slot: Slot | None,
                capped_from: int | None) -> tuple[Response | _JsonBody, bool]:
    """The answer that sends ``result`` in ``fmt``, and whether it streams (then it gives the
    slot back when its body is closed); SqlError for an answer over a cap."""
    _limit_stats(result.stats, capped_from, limits.max_timeout_ms, slot)
    if fmt == "json" and result.rows is not None:
        limits.check_rows(len(result.rows), 0)
        body = json_rows_body(result.schema, result.rows,
                              {"consistency_token": result.consistency_token, "stats": result.stats})
        if body is not None:
            limits.check_rows(0, len(body))  # as JSON: these rows never were Arrow
            return _JsonBody(body), False
    # Read the start of the answer before answering: most failures (unreachable partitions,
    # timeouts, bad plans found late, an answer over a cap) surface here and can still get
    # their real status.
    batches = limits.capped(iter(result.batches))
    try:
        batches.read_ahead()
        token = result.consistency_token
        headers = {TOKEN_HEADER: token} if fmt != "json" and token else {}

        def trailer() -> dict[str, Any]:
            return {"consistency_token": result.consistency_token, "stats": result.stats}

        kept = bool(result.stats.get("answer_reused"))
        whole = _whole_if_small(_closing(body_chunks(fmt, result.schema, batches, trailer, kept), batches))
    except SqlError:
        batches.close()
        raise
    if fmt == "json" and isinstance(whole, bytes):
        return _JsonBody(whole), False  # as a Response would send it, without building one
    resp = Response(whole, mimetype=MEDIA_TYPES[fmt], headers=headers)
    if slot is not None and not isinstance(whole, bytes):  # held until the body has been sent
        resp.call_on_close(slot.release)
        return resp, True
    return resp, False


def _limit_stats(stats: dict[str, Any], capped_from: int | None, max_timeout_ms: int, slot: Slot | None) -> None:
    """What the node's limits did to a request, in its answer's stats."""
    if capped_from is not None:
        stats["timeout_ms_requested"] = capped_from
        stats["timeout_ms"] = max_timeout_ms
    if slot is not None and slot.waited_s:
        stats["queued_ms"] = slot.waited_ms


def lookup_response(node: SqlNode, name: str, key: str) -> Response | _JsonBody:
    """The answer to ``GET /v1/stores/<name>/keys/<key>``: the row as a JSON object, or 404;
    a query like POST /v1/sql's, so it takes a slot of the node's admission for as long."""
    slot = admit(node, 10.0)  # POST /v1/sql's default timeout
    try:
        return _lookup_answer(node.lookup(name, key), name, key)
    finally:
        if slot is not None:
            slot.release()


def lookup_at_once(node: SqlNode, http: Request) -> Response | _JsonBody | Coroutine[Any, Any, Any] | None:
    """``lookup_response``'s answer given on the calling thread's event loop (see
    ``sql_at_once``): when this node reads the key from its own copy while a query slot is free,
    or reads it from the key's owner elsewhere on the loop; None otherwise."""
    now = getattr(node, "lookup_now", None)
    if now is None:
        return None
    name, key = _lookup_names(http.path)
    with _slot_now(node) as slot:
        if slot is False:
            return None
        try:
            got = now(name, key)
        except FederatorError:
            return None  # lookup_response meets it again, and answers it
        if got is None:
            return None
        if isinstance(got, SqlResult):
            return _lookup_answer(got, name, key)
    return _from_owner(got, lambda result: _lookup_answer(result, name, key))


def _lookup_answer(result: SqlResult, name: str, key: str) -> Response | _JsonBody:
    if result.rows:  # the point path's Python rows: no Arrow on the way out
        body = json_object_body(result.schema, result.rows[0])
        if body is not None:
            return _JsonBody(body)
    batch = next((b for b in ([] if result.rows == [] else result.batches) if b.num_rows), None)
    if batch is None:
        return error_response(SqlError("KEY_NOT_FOUND", f"store {name!r} has no key {key!r}", store=name, key=key))
    return _JsonBody(json_object_from_arrow(batch))


def _lookup_names(path: str) -> tuple[str, str]:
    """The store's name and the key of a lookup's path, decoded as Werkzeug decodes a path
    (WSGI gives its bytes as latin-1)."""
    name, _, key = path[len(_STORES):].partition(_KEYS)
    return name.encode("latin-1").decode("utf-8", "replace"), key.encode("latin-1").decode("utf-8", "replace")


def _lookup_fast(node: SqlNode, environ: dict[str, Any]) -> Response | _JsonBody:
    try:
        return lookup_response(node, *_lookup_names(environ["PATH_INFO"]))
    except FederatorError as e:
        return error_response(e)
    except Exception as e:  # noqa: BLE001 - the same JSON 500 the app gives for any other route
        _log.exception("unexpected error on GET %s", environ.get("PATH_INFO"))
        return error_response(e)


_STORES, _KEYS = "/v1/stores/", "/keys/"


class SqlFastPath:
    """WSGI middleware that answers ``POST /v1/sql`` and the REST key lookup
    ``GET /v1/stores/<name>/keys/<key>`` before Flask sees them.

    Flask's request context, URL matching and session handling cost more CPU than a point
    query itself (about 400 us against 150 us here); neither endpoint needs them. Every other
    request, ``GET /v1/sql`` included (Flask's 405), goes on to the app."""

    def __init__(self, app: Any, node: SqlNode) -> None:
        self.app, self.node = app, node

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        route = hot_route(environ.get("REQUEST_METHOD", ""), environ.get("PATH_INFO", ""))
        if route == "sql":
            return sql_response(self.node, environ)(environ, start_response)
        if route == "lookup":
            return _lookup_fast(self.node, environ)(environ, start_response)
        return self.app(environ, start_response)


def hot_route(method: str, path: str) -> str | None:
    """Which hot route a request is for: "sql" (POST /v1/sql), "lookup" (the REST key lookup), or None."""
    if path == "/v1/sql" and method == "POST":
        return "sql"
    if method == "GET" and path.startswith(_STORES) and _is_lookup(path):
        return "lookup"
    return None


def _is_lookup(path: str) -> bool:
    """Whether ``path`` is /v1/stores/<name>/keys/<key> as the Flask route matches it: a
    name without a slash, a key that is not empty (it may hold slashes)."""
    name, sep, key = path[len(_STORES):].partition(_KEYS)
    return bool(sep and name and key and "/" not in name)


def register_sql_routes(app: Flask, node: SqlNode, registry: Registry) -> None:
    app.wsgi_app = SqlFastPath(app.wsgi_app, node)  # type: ignore[method-assign]

    @app.post("/v1/sql")
    def sql() -> Response:
        # reached only when the app runs without SqlFastPath (which answers POSTs first)
        return sql_response(node, request.environ)

    @app.get("/v1/plugins")
    def plugins() -> Response:
        return json_response({"plugins": [asdict(p) for p in registry.plugins],
                              "failed": [asdict(f) for f in registry.failures]})

    @app.get("/v1/stores")
    def stores() -> Response:
        return json_response({"stores": list(node.stores_info())})

    @app.get("/v1/stores/<name>")
    def store(name: str) -> Response:
        return json_response(node.store_info(name))

    @app.get("/v1/stores/<name>/keys/<path:key>")
    def lookup(name: str, key: str) -> Response | _JsonBody:
        # reached only when the app runs without SqlFastPath (which answers lookups first)
        return lookup_response(node, name, key)
