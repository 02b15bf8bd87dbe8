"""Serving the node's HTTP on an asyncio event loop (uvloop) in the node's main thread.

The loop parses HTTP itself (federator.http.loop_protocol) and answers the hot point reads
there, with no hand-over to another thread (federator.http.loop_answers); every other request
goes to the WSGI app on a bounded thread pool (``--threads``), and the loop writes its answer
as it comes. Started and stopped like GranianServer: ``run`` blocks the main thread, ``stop``
(from any thread) ends it; ``on_signal`` takes SIGINT/SIGTERM once it listens; a taken port is
refused as it is constructed. ``run_on_loop`` lets another thread's work run on the loop
(the node's materializer applies small fetches there: see that method).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator

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

    def run_on_loop(self, steps: Iterator[None]) -> bool:
        """Run ``steps`` on the loop's thread, each step (a ``next``) one callback, with the
        loop's other callbacks and I/O between them, and wait for the last (a step's exception
        is raised here); False, with none run, when the loop is not running (not started yet,
        or ended); when it ends midway, the rest run here. So the materializer's applies of
        small fetches (a step a partition) take the GIL in turn with the answers on the loop,
        instead of the two threads handing it back and forth: a thread that gives the GIL up
        for a syscall (each send and poll of the loop) waits the interpreter's switch interval
        (5 ms) to have it back from a thread that runs Python meanwhile."""
        loop = self._loop
        if loop is None or not loop.is_running():
            return False
        run = _Steps(steps, loop)
        try:
            loop.call_soon_threadsafe(run.step)
        except RuntimeError:  # the loop has closed
            return False
        return run.wait()

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


class _Steps:
    """Steps another thread hands the loop (``LoopServer.run_on_loop``), each run once: by the
    loop, or, when the loop ends first, by the thread that waits for them."""

    def __init__(self, steps: Iterator[None], loop: asyncio.AbstractEventLoop) -> None:
        self._steps, self._loop = steps, loop
        self._lock = threading.Lock()
        self._by: str | None = None  # "loop" once it ran a step, "caller" once it has them back
        self._done = threading.Event()
        self._error: BaseException | None = None

    def step(self) -> None:
        with self._lock:
            if self._by == "caller":
                return
            self._by = "loop"
        try:
            next(self._steps)
        except StopIteration:
            self._done.set()
        except BaseException as e:  # noqa: BLE001 - raised again in the thread that waits
            self._error = e
            self._done.set()
        else:
            self._loop.call_soon(self.step)  # after the callbacks and I/O that are ready meanwhile

    def wait(self) -> bool:
        """Whether the steps ran (all of them, once this returns); False when the loop stopped
        before the first."""
        while not self._done.wait(0.2):
            if self._loop.is_running():
                continue
            with self._lock:
                started, self._by = self._by == "loop", "caller"
            if not started:
                return False
            for _ in self._steps:  # the loop ended midway: the rest here
                pass
            return True
        if self._error is not None:
            raise self._error
        return True


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
