"""Answering on the HTTP server's event loop: only what needs no waiting.

Under the GIL, sixteen request threads taking turns cost a point query its tail (p99 of
10-12 ms at 10 clients, the same for a bare hello on those threads). The node's HTTP front
(federator.http.loop_front) therefore first tries a ``POST /v1/sql`` or key lookup on its
one event-loop thread with ``inline()`` set; everything that would wait there (a slot of the
node's admission, a node-to-node call, DuckDB) raises ``NotInline`` instead, and the front
hands the request, as received, to its threads. So the loop only ever runs local key reads.
"""

from __future__ import annotations

import contextvars
from contextlib import contextmanager
from typing import Iterator

_inline: contextvars.ContextVar[bool] = contextvars.ContextVar("federator_inline", default=False)


class NotInline(BaseException):
    """This request must wait for something: answer it on a thread.

    A BaseException, like GeneratorExit: it must pass every ``except Exception`` that turns
    failures into answers (and is not one), while their ``finally`` blocks still release
    what the request took."""


def inline_only() -> bool:
    """Whether the running request may not wait (see the module's text)."""
    return _inline.get()


def refuse_waiting(what: str) -> None:
    """Raise NotInline when the running request may not wait for ``what``."""
    if _inline.get():
        raise NotInline(what)


@contextmanager
def inline() -> Iterator[None]:
    token = _inline.set(True)
    try:
        yield
    finally:
        _inline.reset(token)
