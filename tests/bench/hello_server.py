"""The baseline: a bare Flask app on the node's server stack (the server `federator node` would
use, loop, granian or waitress, with the same thread count), in its own process. On the loop
server ``/hello`` is answered on the event loop, where the node answers its point reads.

    python -m tests.bench.hello_server --port PORT [--threads 16] [--server loop|granian|waitress]

``GET /hello`` answers a small JSON object; ``POST /hello`` also reads and decodes a JSON
body first, the shape of a ``POST /v1/sql`` round trip with none of its work.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from typing import Any

from flask import Flask, Response, request

from federator.http.server import SERVERS, default_server, serve, shutdown


def create_app() -> Flask:
    app = Flask("hello")

    @app.get("/hello")
    def hello_get() -> Response:
        return Response(json.dumps({"hello": "world"}), mimetype="application/json")

    @app.post("/hello")
    def hello_post() -> Response:
        body = json.loads(request.get_data(cache=False))
        return Response(json.dumps({"hello": body.get("parameters")}), mimetype="application/json")

    return app


class HelloOnTheLoop:
    """The loop server's front (federator.http.loop_protocol.Front): ``/hello`` on the loop."""

    def __init__(self, app: Flask) -> None:
        self.app = app

    def at_once(self, req: Any) -> Any:
        return self.app if req.path == "/hello" else None

    def body_cap(self, path: str) -> int | None:
        return None

    def too_large(self, size: str) -> Any:
        raise AssertionError("no body is capped here")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--threads", type=int, default=16)  # `federator node --threads` default
    ap.add_argument("--server", choices=SERVERS, default=None)  # `federator node --server` default
    args = ap.parse_args()
    logging.getLogger("waitress").setLevel(logging.WARNING)
    server_name = args.server or default_server()
    if server_name == "loop":
        from federator.http.loop_server import LoopServer

        loop = LoopServer(create_app(), "127.0.0.1", args.port, threads=args.threads, front=HelloOnTheLoop(create_app()))
        threading.Thread(target=lambda: (loop.listening.wait(30), print(f"ready http://127.0.0.1:{args.port}", flush=True)),
                         daemon=True).start()
        signal.signal(signal.SIGTERM, lambda *_: loop.stop())
        signal.signal(signal.SIGINT, lambda *_: loop.stop())
        loop.run()
        return 0
    if server_name == "granian":
        from federator.http.granian_server import GranianServer

        granian = GranianServer(create_app(), "127.0.0.1", args.port, threads=args.threads)
        threading.Thread(target=lambda: (granian.listening.wait(30), print(f"ready http://127.0.0.1:{args.port}", flush=True)),
                         daemon=True).start()
        granian.run()  # until SIGTERM/SIGINT (granian's own handlers)
        return 0
    server = serve(create_app(), "127.0.0.1", args.port, threads=args.threads)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    http = threading.Thread(target=server.run, name="http", daemon=True)
    http.start()
    print(f"ready http://127.0.0.1:{args.port}", flush=True)
    stopping.wait()
    shutdown(server, http)
    return 0


if __name__ == "__main__":
    sys.exit(main())
