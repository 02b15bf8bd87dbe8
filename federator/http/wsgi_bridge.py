"""A WSGI app's side of the loop server (federator.http.loop_server): the environ of a request
read on the event loop, the head of its answer, and the answer made on a pool thread and
handed to the loop as it comes, the producer held back while the connection cannot take more.
An answer made on the loop itself (a ``Whole``) needs no environ: it is written as it is.
"""

from __future__ import annotations

import functools
import io
import logging
import sys
import threading
from typing import Any, Callable, Iterable, Protocol
from urllib.parse import unquote_to_bytes

from federator.http.errors import error_response

log = logging.getLogger(__name__)

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
# bytes of an answer handed to the loop and not yet written to the socket, beyond which the
# pool thread making it waits: a slow reader holds its producer back instead of filling memory
IN_FLIGHT_BYTES = 1 << 20
_HOP_BY_HOP = frozenset({"connection", "transfer-encoding", "keep-alive"})  # the server's to set
# the headers the loop reads itself (``Request.header``), noted as they are parsed
NOTED = frozenset({b"content-length", b"expect", b"accept", b"authorization"})


class Request:
    """One HTTP request as the loop reads it."""

    __slots__ = ("method", "url", "path", "query", "version", "headers", "body", "keep_alive", "answer", "dropped",
                 "queued", "cap", "peer", "ahead", "noted")

    def __init__(self, peer: str = "") -> None:
        self.method, self.url, self.path, self.query, self.version = "GET", b"", "/", "", "1.1"
        self.headers: list[tuple[bytes, bytes]] = []
        self.noted: dict[bytes, bytes] = {}  # the NOTED headers by lower-case name, repeated ones joined with commas
        self.body = bytearray()
        self.keep_alive = True
        self.answer: WsgiApp | None = None  # set when the server answers it itself (a refusal)
        self.dropped = 0  # body bytes read and dropped after a refusal
        self.queued = False  # waiting for (or given) its answer, before its body was read
        self.cap: int | None = None  # the most body bytes it may have
        self.peer = peer  # the client's address
        self.ahead: dict[str, Any] | None = None  # environ entries the loop worked out already, for a thread

    def refuse(self, answer: WsgiApp) -> None:
        self.answer, self.body = answer, bytearray()

    def note(self, low: bytes, value: bytes) -> None:
        """Header ``low`` (one of NOTED, in lower case) as it was sent, once more."""
        had = self.noted.get(low)
        self.noted[low] = value if had is None else had + b"," + value

    def header(self, name: bytes) -> str | None:
        """Header ``name`` (one of NOTED, in lower case) as its environ entry has it: latin-1
        text, repeated ones joined with commas; None when it was not sent."""
        assert name in NOTED, f"{name!r} is not noted as it is parsed"
        value = self.noted.get(name)
        return None if value is None else value.decode("latin-1")

    def hand_on(self, key: str, value: Any) -> None:
        """Put ``key`` in the environ the app is given if the request goes to a thread (what the
        loop read of it, so that it is not read twice)."""
        if self.ahead is None:
            self.ahead = {}
        self.ahead[key] = value


class Whole:
    """An answer made whole in memory: written by the loop as it is, and a WSGI app for a thread."""

    __slots__ = ("status", "headers", "body")

    def __init__(self, status: str, headers: list[tuple[str, str]], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    def __call__(self, environ: dict[str, Any], start_response: Any) -> list[bytes]:
        start_response(self.status, self.headers)
        return [self.body]


def environ(req: Request, server: tuple[str, int], peer: tuple[str, int], scheme: str) -> dict[str, Any]:
    """The WSGI environ of ``req`` (PEP 3333): the path percent-decoded as latin-1 text, headers
    as HTTP_* (repeated ones joined with commas), the body read already."""
    env: dict[str, Any] = {
        "REQUEST_METHOD": req.method, "SCRIPT_NAME": "", "PATH_INFO": req.path, "QUERY_STRING": req.query,
        "SERVER_NAME": server[0], "SERVER_PORT": str(server[1]), "SERVER_PROTOCOL": f"HTTP/{req.version}",
        "REMOTE_ADDR": peer[0], "REMOTE_PORT": str(peer[1]),
        "wsgi.version": (1, 0), "wsgi.url_scheme": scheme, "wsgi.input": io.BytesIO(req.body),
        "wsgi.errors": sys.stderr, "wsgi.multithread": True, "wsgi.multiprocess": False, "wsgi.run_once": False,
        "wsgi.input_terminated": True,
    }
    for raw_name, raw_value in req.headers:
        name, value = _env_name(raw_name), raw_value.decode("latin-1")
        env[name] = f"{env[name]},{value}" if name in env else value
    if req.ahead:
        env.update(req.ahead)
    return env


@functools.lru_cache(maxsize=512)  # clients send the same few header names again and again
def _env_name(raw: bytes) -> str:
    """A header's name as sent, as its environ key."""
    name = raw.decode("latin-1").upper().replace("-", "_")
    return name if name in ("CONTENT_TYPE", "CONTENT_LENGTH") else "HTTP_" + name


def split_url(url: bytes) -> tuple[str, str]:
    """The WSGI PATH_INFO and QUERY_STRING of a request target (origin or absolute form);
    ValueError for one that is neither."""
    if url == b"*":  # OPTIONS * asks about the server, not a path
        return "*", ""
    if url[:1] == b"/" and b"%" not in url and b"?" not in url and b"#" not in url:  # nothing to decode or split
        return url.decode("latin-1"), ""
    if not url.startswith(b"/"):
        scheme, sep, rest = url.partition(b"://")
        if not sep or scheme.lower() not in (b"http", b"https"):
            raise ValueError(f"the request target {url[:80]!r} is not a path")
        url = b"/" + rest.partition(b"/")[2]
    path, _, query = url.partition(b"?")
    return unquote_to_bytes(path.partition(b"#")[0]).decode("latin-1"), query.partition(b"#")[0].decode("latin-1")


def head(req: Request, status: str, headers: list[tuple[str, str]], length: int | None) -> tuple[bytes, bool]:
    """An answer's status line and headers, and whether its body goes chunked: the app's
    Content-Length, else ``length`` (the whole body's, when known), else chunks (HTTP/1.1) or
    the end of the connection (HTTP/1.0). Sets ``req.keep_alive`` False when the body ends it."""
    lines = [f"HTTP/1.1 {status}\r\n"]
    sized = False
    for name, value in headers:
        low = name.lower()
        if low in _HOP_BY_HOP:
            continue
        sized = sized or low == "content-length"
        lines.append(f"{name}: {value}\r\n")
    chunked = False
    if not sized and req.method != "HEAD":
        if length is not None:
            lines.append(f"Content-Length: {length}\r\n")
        elif req.version == "1.1":
            lines.append("Transfer-Encoding: chunked\r\n")
            chunked = True
        else:
            req.keep_alive = False
    if not req.keep_alive:
        lines.append("Connection: close\r\n")
    elif req.version == "1.0":
        lines.append("Connection: keep-alive\r\n")
    lines.append("\r\n")
    return "".join(lines).encode("latin-1"), chunked


class StartResponse:
    """WSGI's start_response, keeping the status and headers for the writer."""

    __slots__ = ("status", "headers")

    def __init__(self) -> None:
        self.status: str | None = None
        self.headers: list[tuple[str, str]] = []

    def __call__(self, status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], None]:
        if exc_info is not None and self.status is not None:
            raise exc_info[1].with_traceback(exc_info[2])
        self.status, self.headers = status, headers
        return _no_write

    def ready(self) -> tuple[str, list[tuple[str, str]]]:
        if self.status is None:
            raise RuntimeError("the WSGI app returned its body without calling start_response")
        return self.status, self.headers


def _no_write(data: bytes) -> None:
    raise RuntimeError("the loop server takes an answer's body from the app's iterable, not write()")


def run_whole(app: WsgiApp, env: dict[str, Any]) -> tuple[str, list[tuple[str, str]], bytes]:
    """``app``'s whole answer, made on this thread (an answer in memory: the loop's own)."""
    start = StartResponse()
    body = app(env, start)
    try:
        data = b"".join(body)
    finally:
        close = getattr(body, "close", None)
        if close is not None:
            close()
    return *start.ready(), data


class Connection(Protocol):
    """What a pool thread needs of the loop's connection (federator.http.loop_protocol)."""

    room: threading.Condition
    paused: bool
    closed: bool
    in_flight: int

    def call_soon(self, fn: Callable[..., None], *args: Any) -> None: ...
    def write_counted(self, data: bytes) -> None: ...
    def finish(self, req: Request, tail: bytes) -> None: ...
    def abort(self) -> None: ...


class Gone(Exception):
    """The client went away while its answer was being made."""


def answer_in_pool(conn: Connection, req: Request, env: dict[str, Any], app: WsgiApp) -> None:
    """Run ``app`` for ``req`` (on a pool thread) and hand its answer to the loop as it comes:
    a list body in one write with its length, any other iterable chunk by chunk."""
    start = StartResponse()
    chunked, started = False, False
    try:
        body = app(env, start)
        try:
            if isinstance(body, (list, tuple)):
                data = b"".join(body)
                _send(conn, head(req, *start.ready(), len(data))[0] + (b"" if req.method == "HEAD" else data))
                started = True
            else:
                for chunk in body:
                    if not started:
                        first, chunked = head(req, *start.ready(), None)
                        _send(conn, first)
                        started = True
                    if chunk and req.method != "HEAD":
                        _send(conn, b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
                if not started:  # an empty iterable
                    _send(conn, head(req, *start.ready(), 0)[0])
                    started = True
        finally:
            close = getattr(body, "close", None)
            if close is not None:
                close()
        conn.call_soon(conn.finish, req, b"0\r\n\r\n" if chunked else b"")
    except Gone:
        return
    except Exception as e:  # noqa: BLE001 - the client hears a 500 (or a cut answer), the log says why
        log.exception("unexpected error answering %s %s", req.method, req.path)
        if started:
            conn.call_soon(conn.abort)
            return
        status, headers, data = run_whole(error_response(e), env)
        req.keep_alive = False
        try:
            _send(conn, head(req, status, headers, len(data))[0] + data)
        except Gone:
            return
        conn.call_soon(conn.finish, req, b"")


def _send(conn: Connection, data: bytes) -> None:
    """Hand ``data`` to the loop, first waiting while the connection holds enough unwritten."""
    with conn.room:
        while not conn.closed and (conn.paused or conn.in_flight > IN_FLIGHT_BYTES):
            conn.room.wait()
        if conn.closed:
            raise Gone()
        conn.in_flight += len(data)
    conn.call_soon(conn.write_counted, data)
