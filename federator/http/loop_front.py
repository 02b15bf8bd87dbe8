"""The node's HTTP front under granian: key reads on the event loop, the rest on threads.

Served as WSGI on sixteen threads, a point query at 10 clients had a p99 of 10-12 ms, and a
bare Flask hello had the same: the threads take turns on the GIL, in no fair order. One
event-loop thread answering in arrival order has no such turns (an ASGI hello: p99 0.6 ms at
30k requests/s on this machine). But the loop must never wait, and most queries do (a slot,
another node, DuckDB).

So this ASGI app tries each request the app's SQL fast path answers (``POST /v1/sql`` and
the key lookup, see federator.sql.inline) on the loop, with waiting refused; a request that
would wait raises NotInline before anything is sent, and goes, body and all, to the WSGI app
on threads (a2wsgi, as any other request). A key read on its owner is answered on the loop.
"""

from __future__ import annotations

import io
import logging
from typing import Any, Awaitable, Callable, Iterable, Iterator

from a2wsgi import WSGIMiddleware
from a2wsgi.wsgi import build_environ

from federator.sql.inline import NotInline, inline

log = logging.getLogger(__name__)

# larger request bodies go straight to the threads (which also apply the body limit)
_INLINE_BODY_BYTES = 64 * 1024

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
# (method, path) -> whether the app's fast path answers it (set by register_sql_routes)
INLINE_EXTENSION = "federator.inline"


class LoopFront:
    """ASGI for ``app`` (a Flask app or any WSGI app): ``threads`` threads for what waits."""

    def __init__(self, app: Any, threads: int) -> None:
        self._app = app
        self._answers: Callable[[str, str], bool] | None = getattr(app, "extensions", {}).get(INLINE_EXTENSION)
        self._threads = WSGIMiddleware(_as_granian_served(app), workers=threads)

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self._answers is not None and self._answers(scope["method"], scope["path"]):
            body, more = await _read_body(receive, _INLINE_BODY_BYTES)
            if body is None:  # the client went away before it had sent its request
                return
            if not more and await _answer_inline(self._app, scope, body, send):
                return
            receive = _replaying(body, more, receive)
        else:
            receive = _coroutine(receive)
        await self._threads(scope, receive, send)


async def _answer_inline(app: Any, scope: dict[str, Any], body: bytes, send: Send) -> bool:
    """Send ``app``'s answer to the request, computed here with waiting refused; False (nothing
    sent) when it would wait."""
    environ = build_environ(scope, io.BytesIO(body))  # type: ignore[arg-type]
    environ["wsgi.input_terminated"] = True
    started: list[Any] = []
    chunks: list[bytes] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], None]:
        started[:] = [status, headers]
        return chunks.append

    with inline():
        try:
            answer = app(environ, start_response)
        except NotInline:
            return False
        try:
            for chunk in answer:
                chunks.append(chunk)
        except NotInline:
            return False
        except Exception:  # noqa: BLE001 - as on the threads (_ended_on_failure)
            log.warning("an answer failed after it had begun", exc_info=True)
        finally:
            getattr(answer, "close", lambda: None)()
    if not started:
        raise RuntimeError("the WSGI app returned without starting a response")
    status, headers = started
    await send({"type": "http.response.start", "status": int(status.split(" ", 1)[0]),
                "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers]})
    for chunk in chunks:
        if chunk:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})
    return True


async def _read_body(receive: Receive, most: int) -> tuple[bytes | None, bool]:
    """The request body if it is at most ``most`` bytes, else its first part; and whether
    more follows. None when the client went away."""
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None, False
        part = message.get("body", b"")
        parts.append(part)
        size += len(part)
        more = message.get("more_body", False)
        if not more or size > most:
            return b"".join(parts), more


def _replaying(body: bytes, more: bool, receive: Receive) -> Receive:
    """``receive`` with what was already read of the body given again first."""
    replayed = False

    async def again() -> dict[str, Any]:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": more}
        return await receive()
    return again


def _coroutine(receive: Receive) -> Receive:
    """``receive`` as a coroutine function: a2wsgi's threads call it through
    ``asyncio.run_coroutine_threadsafe``, which takes coroutines only, not granian's awaitables."""
    async def call() -> dict[str, Any]:
        return await receive()
    return call


def _as_granian_served(app: Any) -> Callable[..., Any]:
    """``app`` as granian's own WSGI served it: its input ends where the body ends (the server
    delimits it, chunked or not), and a body that fails after it has begun ends there."""
    def call(environ: dict[str, Any], start_response: Any) -> Any:
        environ["wsgi.input_terminated"] = True
        return _ended_on_failure(app(environ, start_response))
    return call


def _ended_on_failure(answer: Iterable[bytes]) -> Iterator[bytes]:
    """The answer's chunks, ended (not cut off) where it fails: the status is sent by then,
    and our answers say in their last chunk that they failed (federator.http.formats)."""
    try:
        yield from answer
    except Exception:  # noqa: BLE001 - logged; the client reads the failure in the body
        log.warning("an answer failed after it had begun", exc_info=True)
    finally:
        getattr(answer, "close", lambda: None)()
