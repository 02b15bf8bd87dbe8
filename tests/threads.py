"""Threads whose failures reach the test.

An exception (an assert included) raised in a plain ``threading.Thread`` only prints a warning,
and ``join(timeout)`` returns whether or not the thread ended. ``Worker`` keeps what its target
raised; ``join_all`` fails the test if a worker is still running after the timeout, and raises
again what a worker raised.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Iterable


class Worker(threading.Thread):
    def __init__(self, target: Callable[..., Any], *args: Any, name: str | None = None, daemon: bool = True) -> None:
        super().__init__(name=name or getattr(target, "__name__", None), daemon=daemon)
        self._target_fn, self._args = target, args
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._target_fn(*self._args)
        except BaseException as e:  # noqa: BLE001 - handed to the test by join_all
            self.error = e

    def join_checked(self, timeout: float) -> None:
        join_all([self], timeout)


def join_all(workers: Iterable[Worker], timeout: float) -> None:
    """Join every worker (``timeout`` seconds each at most); then fail if one is still running,
    or raise the first exception a worker raised (the others are chained in the message)."""
    workers = [w for w in workers if w.ident is not None]  # never started: nothing to join
    for w in workers:
        w.join(timeout)
    stuck = [w.name for w in workers if w.is_alive()]
    assert not stuck, f"threads still running after {timeout:.0f} s: {stuck}"
    failed = [w for w in workers if w.error is not None]
    if failed:
        error = failed[0].error
        notes = [f"(raised in thread {failed[0].name})"]
        if len(failed) > 1:
            others = "; ".join(f"{w.name}: {type(w.error).__name__}: {w.error}" for w in failed[1:])
            notes.append(f"other threads failed too: {others}")
        for note in notes:
            if note not in getattr(error, "__notes__", ()):  # joined again: noted once
                error.add_note(note)
        raise error
