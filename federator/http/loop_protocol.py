"""HTTP/1.1 on an asyncio event loop, parsed by httptools: keep-alive, pipelined requests
answered in order, Content-Length and chunked bodies, Expect: 100-continue, HEAD, a cap on
request bodies.

A request is answered by the front's ``at_once`` on the loop itself when it can be without
blocking: its answer is written at once, or when ``at_once`` gives an awaitable (a read from
another node), when that gives it; else by the WSGI app on the server's thread pool, whose
answer the loop writes as it comes (federator.http.wsgi_bridge). A connection answers
one request at a time; pipelined ones wait in order, and past MAX_PIPELINED it stops reading.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Awaitable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol as Typing

import httptools

from federator.errors import SqlError
from federator.http.errors import error_response
from federator.http.sql_routes import DRAIN_MAX
from federator.http.wsgi_bridge import NOTED, Request, Whole, WsgiApp, answer_in_pool, environ, head, run_whole, split_url

log = logging.getLogger(__name__)

MAX_PIPELINED = 32  # requests read ahead of their answers before a connection stops reading
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class Front(Typing):
    """What the server asks of the node's routes (federator.http.loop_answers)."""

    def at_once(self, req: Request) -> WsgiApp | Awaitable[WsgiApp | None] | None: ...
    def body_cap(self, path: str) -> int | None: ...
    def too_large(self, size: str) -> WsgiApp: ...


@dataclass
class Served:
    """What every connection of one server shares."""

    app: WsgiApp
    front: Front | None
    pool: Executor
    loop: asyncio.AbstractEventLoop
    address: tuple[str, int]
    scheme: str
    connections: set[HttpProtocol] = field(default_factory=set)
    stopping: bool = False


class HttpProtocol(asyncio.Protocol):
    def __init__(self, served: Served) -> None:
        self.served = served
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.peer: tuple[str, int] = ("", 0)
        self.req: Request | None = None  # the request being read
        self.waiting: deque[Request] = deque()  # read, not yet answered
        self.busy = False  # an answer is being made on the pool, or waited for on the loop
        self.task: asyncio.Task | None = None  # the answer waited for on the loop
        self.ending = False  # closing once the answer being written is done
        self.unreadable = False  # the client sent what is not HTTP: answer what came before, read no more
        self.reading = True
        self.continue_owed = False
        # flow control of answers made on the pool (federator.http.wsgi_bridge.Connection)
        self.room = threading.Condition()
        self.paused = self.closed = False
        self.in_flight = 0
        self.last = 0.0  # the loop's time when it last read a request's bytes or finished an answer

    # ---- asyncio ----------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.last = self.served.loop.time()
        peer = transport.get_extra_info("peername")
        self.peer = (str(peer[0]), int(peer[1])) if isinstance(peer, tuple) else ("", 0)
        self.served.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.task is not None:  # nobody to answer: stop waiting for it
            self.task.cancel()
        with self.room:
            self.closed = True
            self.room.notify_all()  # a producer waiting for room finds the client gone
        self.served.connections.discard(self)

    def pause_writing(self) -> None:
        with self.room:
            self.paused = True

    def resume_writing(self) -> None:
        with self.room:
            self.paused = False
            self.room.notify_all()

    def data_received(self, data: bytes) -> None:
        if self.ending or self.unreadable:
            return
        self.last = self.served.loop.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:  # its request is answered in HTTP/1.1; then the connection ends
            self.unreadable = True
            if self._idle() and self.req is None and self.transport is not None:
                self.transport.close()
        except httptools.HttpParserError as e:
            self._refuse_connection(f"the request is not valid HTTP/1.1: {e}")

    # ---- httptools' callbacks ---------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.req = Request(self.peer[0])

    def on_url(self, url: bytes) -> None:
        assert self.req is not None
        self.req.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        req = self.req
        assert req is not None
        req.headers.append((name, value))
        low = name.lower()
        if low in NOTED:
            req.note(low, value)

    def on_headers_complete(self) -> None:
        req = self.req
        assert req is not None
        req.method = self.parser.get_method().decode("latin-1")
        req.version = self.parser.get_http_version()
        req.keep_alive = self.parser.should_keep_alive()
        try:
            req.path, req.query = split_url(req.url)
        except ValueError as e:
            req.refuse(error_response(SqlError("BAD_REQUEST", str(e))))
            return
        front = self.served.front
        req.cap = front.body_cap(req.path) if front is not None else None
        length, expect = req.noted.get(b"content-length"), req.noted.get(b"expect")
        if front is not None and req.cap is not None and length is not None and length.isdigit() \
                and int(length) > req.cap:
            req.refuse(front.too_large(f"{int(length):,}"))
        if expect is not None and expect.lower() == b"100-continue":
            if req.answer is not None:  # refused before its body: answer now, and end the connection
                req.keep_alive = False
                self._queue(req)
            elif self._idle():
                self._write(_CONTINUE)
            else:
                self.continue_owed = True

    def on_body(self, body: bytes) -> None:
        req = self.req
        assert req is not None
        if req.answer is not None:
            req.dropped += len(body)
            if req.dropped > DRAIN_MAX and not req.queued:  # too much to drop: answer, then close
                req.keep_alive = False
                self._queue(req)
            return
        req.body += body
        if req.cap is not None and len(req.body) > req.cap and self.served.front is not None:
            req.refuse(self.served.front.too_large(f"more than {req.cap:,}"))

    def on_message_complete(self) -> None:
        req, self.req = self.req, None
        if req is not None and not req.queued:
            self._queue(req)

    # ---- answering --------------------------------------------------------------------------
    def _idle(self) -> bool:
        return not (self.busy or self.waiting or self.ending)

    def _queue(self, req: Request) -> None:
        req.queued = True
        if self.ending:
            return
        self.waiting.append(req)
        if len(self.waiting) >= MAX_PIPELINED and self.reading and self.transport is not None:
            self.transport.pause_reading()
            self.reading = False
        self._next()

    def _next(self) -> None:
        while not (self.busy or self.ending or self.closed) and self.waiting:
            req = self.waiting.popleft()
            if not self.reading and len(self.waiting) < MAX_PIPELINED // 2 and self.transport is not None:
                self.transport.resume_reading()
                self.reading = True
            app = req.answer or self._at_once(req)
            if app is None:
                self._to_pool(req)
            elif isinstance(app, Awaitable):  # an answer that waits on the loop (another node's read)
                self.busy = True
                self.task = self.served.loop.create_task(self._awaited(req, app))
            else:
                self._write_whole(req, app)
        if self.continue_owed and self._idle() and self.req is not None:
            self.continue_owed = False
            self._write(_CONTINUE)

    def _at_once(self, req: Request) -> WsgiApp | Awaitable[WsgiApp | None] | None:
        front = self.served.front
        if front is None:
            return None
        try:
            return front.at_once(req)
        except Exception:  # noqa: BLE001 - the pool's answer tells the client; the log keeps why
            _failed_on_loop(req)
            return None

    async def _awaited(self, req: Request, pending: Awaitable[WsgiApp | None]) -> None:
        """The answer ``pending`` gives, written when it comes; the pool's when it gives none.
        Cancelled when the client goes away."""
        try:
            app = await pending
        except Exception:  # noqa: BLE001 - as _at_once
            _failed_on_loop(req)
            app = None
        self.task = None
        if app is None:
            self._to_pool(req)
        else:
            self._write_whole(req, app)

    def _write_whole(self, req: Request, app: WsgiApp) -> None:
        if isinstance(app, Whole):  # made on the loop: no environ, no WSGI call
            status, headers, data = app.status, app.headers, app.body
        else:
            status, headers, data = _whole(app, self._environ(req))
        first = head(req, status, headers, len(data))[0]
        self._write(first if req.method == "HEAD" else first + data)
        self._done(req)

    def _to_pool(self, req: Request) -> None:
        self.busy = True
        self.served.pool.submit(answer_in_pool, self, req, self._environ(req), self.served.app)

    def _environ(self, req: Request) -> dict[str, Any]:
        return environ(req, self.served.address, self.peer, self.served.scheme)

    def _done(self, req: Request) -> None:
        if not req.keep_alive or self.served.stopping or (self.unreadable and not self.waiting):
            self.ending = True
            if self.transport is not None:
                self.transport.close()  # after what is buffered has been written
            return
        self.busy = False
        self.last = self.served.loop.time()
        self._next()

    def _write(self, data: bytes) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    def _refuse_connection(self, message: str) -> None:
        """A request that cannot be parsed: its 400 after the answers before it, then close."""
        req = self.req if self.req is not None and not self.req.queued else Request()  # (queued: its answer is on its way)
        self.req = None
        req.refuse(error_response(SqlError("BAD_REQUEST", message)))
        req.keep_alive = False
        self.unreadable = True
        self._queue(req)

    def stop(self) -> None:
        """Close once the answer in progress is written (now, when there is none)."""
        if self._idle() and self.req is None and self.transport is not None:
            self.transport.close()

    def close_if_idle(self, since: float) -> None:
        """Close when no answer is being made or waits and nothing was read since ``since`` (a
        kept-alive connection left unused, or a request that stopped coming half-way)."""
        if self._idle() and self.last < since and self.transport is not None:
            self.transport.close()

    # ---- federator.http.wsgi_bridge.Connection: called from pool threads, or on the loop ----
    def call_soon(self, fn: Callable[..., None], *args: Any) -> None:
        self.served.loop.call_soon_threadsafe(fn, *args)

    def write_counted(self, data: bytes) -> None:
        with self.room:
            self.in_flight -= len(data)
            self.room.notify_all()
        self._write(data)

    def finish(self, req: Request, tail: bytes) -> None:
        if tail:
            self._write(tail)
        self._done(req)

    def abort(self) -> None:
        """End an answer cut short: what was sent of it goes out, without the end of its body, so
        the client sees it cut off (and reads the error an Arrow or CSV body ends with)."""
        self.ending = True
        if self.transport is not None:
            self.transport.close()


def _failed_on_loop(req: Request) -> None:
    log.exception("the loop's answer to %s %s failed; answering it on a thread", req.method, req.path)


def _whole(app: WsgiApp, env: dict[str, Any]) -> tuple[str, list[tuple[str, str]], bytes]:
    try:
        return run_whole(app, env)
    except Exception as e:  # noqa: BLE001 - the JSON 500 the app gives for any other failure
        log.exception("unexpected error answering %s %s", env["REQUEST_METHOD"], env["PATH_INFO"])
        return run_whole(error_response(e), env)
