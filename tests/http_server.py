"""A real waitress server for a WSGI app in a test, on a free loopback port."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from federator.http import bound_port, serve, shutdown, start


@contextlib.contextmanager
def running(app: Any, threads: int = 2) -> Iterator[str]:
    """Serve ``app`` while the block runs; yields its host:port."""
    server = serve(app, "127.0.0.1", 0, threads=threads)
    thread = start(server)
    try:
        yield f"127.0.0.1:{bound_port(server)}"
    finally:
        shutdown(server, thread)
