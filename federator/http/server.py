"""Serving the app with waitress (a production WSGI server), startable and stoppable in-process.

``serve`` only creates the server (bound and listening), so the caller learns the real
port before any request arrives; ``start`` runs it in a thread; ``shutdown`` ends it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

import waitress
from waitress import wasyncore
from waitress.trigger import trigger as Trigger

from federator.settings import BY_NAME, SERVERS, NodeSettings, from_text

log = logging.getLogger(__name__)

# How long shutdown waits for a loop it was not told about before closing the sockets itself;
# a running loop wakes on the trigger and empties its map within milliseconds.
_GRACE_S = 1.0




def default_server() -> str:
    """The HTTP server `federator node` uses unless told otherwise: its variable
    ($FEDERATOR_HTTP_SERVER), else the setting's default."""
    setting = BY_NAME["server"]
    env = setting.meta.env
    return from_text(setting, os.environ[env], f"${env}") if env and os.environ.get(env) else NodeSettings.server


def serve(app: Any, host: str, port: int, threads: int = 8) -> Any:
    """A waitress server for ``app`` on host:port (port 0 = any free port), not yet running.

    Run it with ``server.run()`` (blocks) or ``start(server)``; find the port with ``bound_port``.
    """
    return waitress.create_server(app, host=host, port=port, threads=threads, ident="federator")


def bound_port(server: Any) -> int:
    """The port the server listens on (useful after asking for port 0)."""
    if hasattr(server, "effective_port"):
        return int(server.effective_port)
    return int(server.effective_listen[0][1])  # a MultiSocketServer (a host with several addresses)


def start(server: Any) -> threading.Thread:
    """Run ``server`` in a daemon thread (daemon: a forgotten server must not keep the process alive)."""
    thread = threading.Thread(target=server.run, name="federator-http", daemon=True)
    thread.start()
    return thread


def _socket_map(server: Any) -> dict:
    # TcpWSGIServer keeps its map in _map; MultiSocketServer (several listen addresses) in map.
    return server._map if hasattr(server, "_map") else server.map


def shutdown(server: Any, thread: threading.Thread | None = None, timeout: float = 5.0) -> None:
    """Stop accepting, close every connection, end the worker threads; wait for ``thread`` if given.

    Works whether the server runs via ``start`` or the caller's own ``server.run()`` thread.
    Closing sockets from another thread races with the loop's select(), so the closing is
    handed to the loop through waitress's trigger (its thunks run in the loop thread); the loop
    then finds its socket map empty and returns. A loop that is not running never empties the
    map, so after a grace period the sockets are closed here instead.
    """
    smap = _socket_map(server)
    trigger = next((d for d in list(smap.values()) if isinstance(d, Trigger)), None)
    deadline = time.monotonic() + timeout
    if trigger is not None and (thread is None or thread.is_alive()):
        try:
            trigger.pull_trigger(lambda: wasyncore.close_all(smap, ignore_all=True))
        except OSError:  # the loop already closed its trigger: it is ending by itself
            pass
        grace = time.monotonic() + (timeout if thread is not None else min(timeout, _GRACE_S))
        while smap and time.monotonic() < grace:
            time.sleep(0.005)
    if smap:
        wasyncore.close_all(smap, ignore_all=True)
    if thread is not None:
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            log.warning("the HTTP server loop did not end within %.1fs", timeout)
    server.task_dispatcher.shutdown(timeout=timeout)
