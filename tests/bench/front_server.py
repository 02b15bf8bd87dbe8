"""A server front with a fixed amount of Python work per request and nothing of Federator.

    python -m tests.bench.front_server --port PORT --keys FILE --front wsgi --threads 16 --work-us 60
    python -m tests.bench.front_server --port PORT --keys FILE --front loop|uvicorn|aiohttp|protocol

Every front answers the same requests the same way (``answer``): ``GET
/v1/stores/kv/keys/<key>`` and ``POST /v1/sql`` with the SQL point query's JSON body (its
one parameter is the key) each hold the GIL for ``--work-us`` microseconds of Python (a
spin on the clock, which the interpreter can interrupt like any Python code), then look the
key up in a table made from ``--keys`` (a key's value is its index there, 0 for the first) and answer
``{"key": ..., "value": ...}``; an unknown key gets 404, anything else 400. The fronts:

- ``wsgi``: granian's WSGI worker on ``--threads`` threads, in-process, as ``federator
  node`` serves (federator.http.granian_server);
- ``loop``: granian's ASGI worker, every request answered on its one event-loop thread
  (requests and body reads are handed over from granian's Rust threads);
- ``uvicorn``: uvicorn's ASGI server, one worker, parsing with httptools on uvloop: the loop
  thread parses HTTP and answers, no hand-over;
- ``aiohttp``: aiohttp's own web server on one asyncio loop, as Faust serves its views;
- ``protocol``: an ``asyncio.Protocol`` parsing with httptools on uvloop, writing the
  response itself: the least a loop front can do per request in Python.

Used by tests/bench/test_bench_server_front.py to tell the server front's part of the point
lookup's tail from the query's, and to compare fronts for the node.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from http import HTTPStatus
from pathlib import Path
from typing import Any, Callable

REST_PREFIX = "/v1/stores/kv/keys/"
SQL_PATH = "/v1/sql"
CONTENT_TYPE = "application/json"
Answer = Callable[[str, str, bytes], tuple[int, bytes]]  # (method, path, body) -> (status, body)


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def answerer(values: dict[str, int], work_s: float) -> Answer:
    """The one answer every front gives: ``work_s`` of Python, then the key's value."""
    def answer(method: str, path: str, body: bytes) -> tuple[int, bytes]:
        spin(work_s)
        if method == "GET" and path.startswith(REST_PREFIX):
            key = path[len(REST_PREFIX):]
        elif method == "POST" and path == SQL_PATH:
            try:
                (key,) = json.loads(body)["parameters"]
            except (ValueError, KeyError, TypeError):
                return 400, b'{"error": "POST /v1/sql takes {\\"sql\\": ..., \\"parameters\\": [KEY]}"}'
        else:
            return 400, b'{"error": "GET /v1/stores/kv/keys/KEY or POST /v1/sql"}'
        value = values.get(key)
        if value is None:
            return 404, json.dumps({"error": f"no key {key!r}"}).encode()
        return 200, json.dumps({"key": key, "value": value}).encode()
    return answer


def _reason(status: int) -> str:
    return f"{status} {HTTPStatus(status).phrase}"


# ---- granian: WSGI on threads (the node's front), ASGI on its loop ---------------------------------

def wsgi_app(answer: Answer) -> Any:
    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        body = environ["wsgi.input"].read()  # granian has read it already
        status, out = answer(environ["REQUEST_METHOD"], environ["PATH_INFO"], body)
        start_response(_reason(status), [("Content-Type", CONTENT_TYPE), ("Content-Length", str(len(out)))])
        return [out]
    return app


def asgi_app(answer: Answer) -> Any:
    """One ASGI app for granian's loop and uvicorn; a POST's body is read first (``receive``),
    as a front answering ``POST /v1/sql`` on the loop would have to."""
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        chunks = []
        if scope["method"] != "GET":
            while True:
                message = await receive()
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    break
        status, out = answer(scope["method"], scope["path"], b"".join(chunks))
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", CONTENT_TYPE.encode()), (b"content-length", str(len(out)).encode())]})
        await send({"type": "http.response.body", "body": out, "more_body": False})
    return app


def serve_granian(answer: Answer, port: int, front: str, threads: int) -> None:
    from granian.constants import Interfaces
    from granian.server.mt import MTServer

    from federator.http.granian_server import GranianServer

    if front == "wsgi":
        server = GranianServer(wsgi_app(answer), "127.0.0.1", port, threads=threads)
        threading.Thread(target=lambda: (server.listening.wait(30), print("ready", flush=True)), daemon=True).start()
        server.run()
        return

    class LoopServer(MTServer):
        def _check_gil(self) -> None:  # one worker thread under the GIL, as GranianServer runs it
            return None

    loop = LoopServer("front_server:loop", address="127.0.0.1", port=port, interface=Interfaces.ASGINL,
                      workers=1, log_enabled=False)
    loop.on_startup(lambda: print("ready", flush=True))
    loop.serve(target_loader=lambda _label: asgi_app(answer))


# ---- fronts that parse HTTP on the loop thread ------------------------------------------------------

def serve_uvicorn(answer: Answer, port: int) -> None:
    import uvicorn

    uvicorn.run(asgi_app(answer), host="127.0.0.1", port=port, http="httptools", loop="uvloop", workers=1,
                lifespan="off", access_log=False, log_level="warning")


def serve_aiohttp(answer: Answer, port: int) -> None:
    from aiohttp import web

    async def handle(request: web.Request) -> web.Response:
        body = await request.read() if request.method == "POST" else b""
        status, out = answer(request.method, request.path, body)
        return web.Response(status=status, body=out, content_type=CONTENT_TYPE)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


class HttpProtocol(asyncio.Protocol):
    """HTTP/1.1 with keep-alive and pipelining, parsed by httptools; answered as each request ends."""

    def __init__(self, answer: Answer) -> None:
        import httptools

        self.answer = answer
        self.parser = httptools.HttpRequestParser(self)
        self.parse_error = httptools.HttpParserError
        self.transport: asyncio.Transport | None = None
        self.url, self.body = b"", bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except self.parse_error as e:
            self._write(400, json.dumps({"error": f"bad HTTP request: {e}"}).encode(), keep_alive=False)

    # httptools' callbacks
    def on_message_begin(self) -> None:
        self.url, self.body = b"", bytearray()

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        path = self.url.split(b"?", 1)[0].decode("latin-1")
        status, out = self.answer(self.parser.get_method().decode("latin-1"), path, bytes(self.body))
        self._write(status, out, self.parser.should_keep_alive())

    def _write(self, status: int, out: bytes, keep_alive: bool) -> None:
        assert self.transport is not None
        close = "" if keep_alive else "Connection: close\r\n"
        head = (f"HTTP/1.1 {_reason(status)}\r\nContent-Type: {CONTENT_TYPE}\r\nContent-Length: {len(out)}\r\n"
                f"{close}\r\n")
        self.transport.write(head.encode("latin-1") + out)
        if not keep_alive:
            self.transport.close()


def serve_protocol(answer: Answer, port: int) -> None:
    import uvloop

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(lambda: HttpProtocol(answer), "127.0.0.1", port)
        print("ready", flush=True)
        await server.serve_forever()

    uvloop.run(main())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--keys", type=Path, required=True, help="one key a line; a key's value is its index (0 first)")
    ap.add_argument("--front", choices=("wsgi", "loop", "uvicorn", "aiohttp", "protocol"), required=True)
    ap.add_argument("--threads", type=int, default=16, help="the wsgi front's threads")
    ap.add_argument("--work-us", type=float, default=60.0)
    args = ap.parse_args()
    values = {key: i for i, key in enumerate(args.keys.read_text().splitlines())}
    answer = answerer(values, args.work_us / 1e6)
    if args.front in ("wsgi", "loop"):
        serve_granian(answer, args.port, args.front, args.threads)
    elif args.front == "uvicorn":
        serve_uvicorn(answer, args.port)
    elif args.front == "aiohttp":
        serve_aiohttp(answer, args.port)
    else:
        serve_protocol(answer, args.port)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
