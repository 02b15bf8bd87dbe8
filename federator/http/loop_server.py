"""Serving the node's HTTP on an asyncio event loop (uvloop) in the node's main thread.

The loop parses HTTP itself (federator.http.loop_protocol) and answers the hot point reads
there, with no hand-over to another thread (federator.http.loop_answers); every other request
goes to the WSGI app on a bounded thread pool (``--threads``), and the loop writes its answer
as it comes. Started and stopped like GranianServer: ``run`` blocks the main thread, ``stop``
(from any thread) ends it; ``on_signal`` takes SIGINT/SIGTERM once it listens; a taken port is
refused as it is constructed.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import uvloop

from federator.http.loop_protocol import Front, HttpProtocol, Served
from federator.http.ports import bind
from federator.http.wsgi_bridge import WsgiApp
from federator.tls import Tls

log = logging.getLogger(__name__)

BACKLOG = 1024
IDLE_S = 60.0  # a connection without a request in progress for this long is closed
STOP_GRACE_S = 10.0  # how long ``stop`` lets answers in progress finish before closing their connections


class LoopServer:
    def __init__(self, app: WsgiApp, host: str, port: int, threads: int = 16,
                 on_signal: Callable[[], None] | None = None, tls: Tls | None = None,
                 front: Front | None = None, idle_s: float = IDLE_S) -> None:
        """``app`` served on host:port (port 0: any free port, then see ``port``); ``front``
        answers what it can on the loop and caps request bodies (None: the app answers all)."""
        self.app, self.host, self.front, self.tls, self.threads = app, host, front, tls, threads
        self.idle_s = idle_s
        self._sock = bind(host, port)
        self.port: int = self._sock.getsockname()[1]
        self.listening = threading.Event()
        self._on_signal = on_signal
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._stop_asked = threading.Event()

    def run(self) -> None:
        """Serve until ``stop``. Main thread only when ``on_signal`` is given (signal handlers)."""
        try:
            uvloop.run(self._serve())
        finally:
            self._sock.close()

    def stop(self) -> None:
        """End ``run``: stop accepting, let answers in progress finish, close the connections."""
        self._stop_asked.set()
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:  # the loop has ended already
                pass

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._loop = loop
        pool = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="http")
        served = Served(self.app, self.front, pool, loop, (self.host, self.port), "https" if self.tls else "http")
        self._sock.listen(BACKLOG)
        server = await loop.create_server(lambda: HttpProtocol(served), sock=self._sock,
                                          ssl=self.tls.server if self.tls is not None else None)
        if self._on_signal is not None:
            handler = self._on_signal
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, lambda *_: handler())
        self.listening.set()
        if self._stop_asked.is_set():  # stop() came before the loop ran
            self._stop.set()
        sweeper = loop.create_task(_close_idle(served, self.idle_s))
        await self._stop.wait()
        sweeper.cancel()
        await _close(server, served)
        pool.shutdown(wait=False, cancel_futures=True)


async def _close_idle(served: Served, idle_s: float) -> None:
    while True:
        await asyncio.sleep(min(idle_s / 2, 5.0))
        since = served.loop.time() - idle_s
        for conn in list(served.connections):
            conn.close_if_idle(since)


async def _close(server: Any, served: Served) -> None:
    served.stopping = True
    server.close()
    for conn in list(served.connections):
        conn.stop()
    deadline = served.loop.time() + STOP_GRACE_S
    while served.connections and served.loop.time() < deadline:
        await asyncio.sleep(0.02)
    for conn in list(served.connections):
        if conn.transport is not None:
            conn.transport.abort()
