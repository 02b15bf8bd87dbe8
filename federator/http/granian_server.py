"""Serving the app with granian (a Rust HTTP server) inside the node's own process.

A node keeps its shards, changelog tails and routing view in memory, so its WSGI app must
run in the node process. granian's usual server forks worker processes; its thread-based
server (``MTServer``, made for free-threaded Python) runs the same Rust WSGI worker as a
thread of this process instead. With the GIL a single worker is what we want anyway: Python
runs one request at a time either way, and the HTTP parsing, keep-alive and writes happen in
Rust, outside the GIL. That is where the time goes for small requests: a bare WSGI answer
costs ~60 us of CPU here against ~240 us on waitress.

``MTServer`` refuses to start when the GIL is on (``_check_gil``); that check is about
free-threaded builds and is skipped here. granian is pinned to the version this was tested
with, since ``MTServer`` is not a documented embedding API.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any, Callable

from granian.constants import Interfaces
from granian.server.mt import MTServer

from federator.broker import port_open
from federator.http.ports import bind
from federator.tls import Tls

log = logging.getLogger(__name__)


class _InProcessServer(MTServer):
    def _check_gil(self) -> None:  # one worker thread under the GIL is the intended use here
        return None


class GranianServer:
    """``app`` served on host:port by granian; ``run`` blocks in the main thread until ``stop``.

    granian installs its SIGINT/SIGTERM handlers when it starts; ``on_signal`` (if given)
    replaces them once it is listening, so the caller decides the order of a shutdown
    (hand partitions over first, then stop serving) and calls ``stop`` at the end.
    """

    def __init__(self, app: Any, host: str, port: int, threads: int = 8,
                 on_signal: Callable[[], None] | None = None, tls: Tls | None = None) -> None:
        if port == 0:
            raise ValueError("the granian server needs an explicit port (--listen HOST:PORT with PORT > 0)")
        # granian binds with SO_REUSEPORT, so a second node on a taken port would start and
        # silently share it; a plain bind fails on a port anyone holds, so try one first
        bind(host, port).close()
        self.app, self.host, self.port = app, host, port
        self.listening = threading.Event()
        self._server = _InProcessServer(
            "federator.http.app:create_app",  # only a label: the app is handed over below
            address=host, port=port, interface=Interfaces.WSGI, workers=1, blocking_threads=threads,
            log_enabled=False, log_access=False,
            **({"ssl_cert": tls.cert, "ssl_key": tls.key} if tls is not None else {}),
        )
        self._on_signal = on_signal
        self._server.on_startup(self._started)

    def _started(self) -> None:
        if self._on_signal is not None:
            handler = self._on_signal
            signal.signal(signal.SIGINT, lambda *_: handler())
            signal.signal(signal.SIGTERM, lambda *_: handler())
        # The worker binds its socket after this hook (SO_REUSEPORT, one socket per worker):
        # ``listening`` waits until a connection is accepted.
        threading.Thread(target=self._await_listening, name="granian-ready", daemon=True).start()

    def _await_listening(self, timeout: float = 30.0) -> None:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else "::1" if self.host == "::" else self.host
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if port_open(host, self.port, timeout=0.5):
                self.listening.set()
                return
            time.sleep(0.02)
        log.error("granian did not start listening on %s:%s within %.0fs", self.host, self.port, timeout)

    def run(self) -> None:
        """Serve until ``stop`` (or, without ``on_signal``, SIGINT/SIGTERM). Main thread only:
        granian sets signal handlers as it starts."""
        self._server.serve(target_loader=lambda _label: self.app)

    def stop(self) -> None:
        """End ``run``: close the listener, let requests in flight finish, stop the worker."""
        self._server.signal_handler_interrupt()
