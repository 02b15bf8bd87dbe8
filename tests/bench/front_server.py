"""A server front with a fixed amount of Python work per request and nothing of Federator.

    python -m tests.bench.front_server --port PORT --front wsgi --threads 16 --work-us 60
    python -m tests.bench.front_server --port PORT --front loop --work-us 60

``wsgi``: granian's WSGI worker on ``--threads`` threads, in-process, as ``federator node``
serves (federator.http.granian_server). ``loop``: granian's ASGI worker, every request
answered on its one event-loop thread; a POST's body is read first (``receive``), as a
front answering ``POST /v1/sql`` there would have to. Each request holds the GIL for
``--work-us`` microseconds of Python (a spin on the clock, which the interpreter can
interrupt like any Python code), then answers a small JSON body. Used by
tests/bench/test_bench_server_front.py to tell the server front's part of the point
lookup's tail from the query's.
"""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any

from granian.constants import Interfaces
from granian.server.mt import MTServer

from federator.http.granian_server import GranianServer

BODY = b'{"key": "key-0000001", "value": 7}'
HEADERS = [("Content-Type", "application/json"), ("Content-Length", str(len(BODY)))]


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def wsgi_app(work_s: float) -> Any:
    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        environ["wsgi.input"].read()  # granian has read it already
        spin(work_s)
        start_response("200 OK", HEADERS)
        return [BODY]
    return app


def loop_app(work_s: float) -> Any:
    start = {"type": "http.response.start", "status": 200,
             "headers": [(k.lower().encode(), v.encode()) for k, v in HEADERS]}
    body = {"type": "http.response.body", "body": BODY, "more_body": False}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["method"] != "GET":
            while (await receive()).get("more_body"):
                pass
        spin(work_s)
        await send(start)
        await send(body)
    return app


class _LoopServer(MTServer):
    def _check_gil(self) -> None:  # one worker thread under the GIL, as GranianServer runs it
        return None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--front", choices=("wsgi", "loop"), required=True)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--work-us", type=float, default=60.0)
    args = ap.parse_args()
    work_s = args.work_us / 1e6
    if args.front == "wsgi":
        server = GranianServer(wsgi_app(work_s), "127.0.0.1", args.port, threads=args.threads)
        threading.Thread(target=lambda: (server.listening.wait(30), print("ready", flush=True)), daemon=True).start()
        server.run()
        return 0
    loop = _LoopServer("front_server:loop", address="127.0.0.1", port=args.port, interface=Interfaces.ASGINL,
                       workers=1, log_enabled=False)
    loop.on_startup(lambda: print("ready", flush=True))
    loop.serve(target_loader=lambda _label: loop_app(work_s))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
