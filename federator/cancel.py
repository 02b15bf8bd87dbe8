"""A request's cancel switch: the Postgres protocol's cancel request reaches the statement through it.

Whoever runs part of the request registers how to stop it (a DuckDB cursor's interrupt) for as
long as it runs; ``cancel()`` calls every registered stop and makes later checks see it.
"""

from __future__ import annotations

import threading
from typing import Callable


class Cancel:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cancelled = False
        self._stops: dict[int, Callable[[], None]] = {}
        self._next = 0

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            stops = list(self._stops.values())
        for stop in stops:
            stop()

    def on_cancel(self, stop: Callable[[], None]) -> Callable[[], None]:
        """Call ``stop`` on cancel (at once when already cancelled); the returned function unregisters it."""
        with self._lock:
            if not self._cancelled:
                handle, self._next = self._next, self._next + 1
                self._stops[handle] = stop
                return lambda: self._forget(handle)
        stop()
        return lambda: None

    def _forget(self, handle: int) -> None:
        with self._lock:
            self._stops.pop(handle, None)
