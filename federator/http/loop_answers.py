"""What the loop server (federator.http.loop_server) asks of the node's public routes: the
answers it gives on its event loop, and the cap on request bodies.

On the loop: the SQL point query and the REST key lookup when this node reads the key from
its own copy at once, or from the key's owner elsewhere over its key port (awaited on the loop),
and a statement whose small answer this node keeps and knows to be current (``sql_at_once``,
``lookup_at_once``: the routes' own functions), after the same bearer-token check as the app's.
Everything else goes to the Flask app on a thread.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, Callable

from federator.auth import Users
from federator.metrics import Metrics
from federator.errors import SqlError
from federator.http.bearer_auth import USER_KEY, BearerAuth
from federator.http.errors import error_response, wsgi_error
from federator.http.sql_routes import SqlNode, hot_route, lookup_at_once, sql_at_once
from federator.http.wsgi_bridge import Request, WsgiApp
from federator.sql.limits import limits_of

_AT_ONCE: dict[str | None, Callable[[SqlNode, Request], WsgiApp | Awaitable[WsgiApp | None] | None]] = {
    "sql": sql_at_once, "lookup": lookup_at_once}
_INTERNAL = "/internal"  # node-to-node calls: the cluster secret guards them, and their bodies are the nodes' own


class LoopAnswers:
    def __init__(self, node: SqlNode, users: Users | None = None) -> None:
        self.node = node
        self.limits = limits_of(node)
        self.metrics: Metrics | None = getattr(node, "metrics", None)  # the node's (a SqlService's)
        self.auth = BearerAuth(_no_app, users) if users is not None else None

    def at_once(self, req: Request) -> WsgiApp | Awaitable[WsgiApp | None] | None:
        """The answer to give on the loop (or what gives it there), or None: the app answers on a thread."""
        route = hot_route(req.method, req.path)
        answer = _AT_ONCE.get(route)
        if answer is None:
            return None
        assert route is not None
        if self.auth is not None:
            # each login counted once: here, not again on a thread
            refused, user = self.auth.check(req.path, req.header(b"authorization"), req.peer)
            if refused is not None:
                self._count(route, "at_once")
                return _Refused(refused)
            if user is not None:
                req.hand_on(USER_KEY, user)
        got = answer(self.node, req)
        if isinstance(got, Awaitable):
            return self._from_owner(route, got)
        self._count(route, "at_once" if got is not None else "threads")
        return got

    async def _from_owner(self, route: str, pending: Awaitable[WsgiApp | None]) -> WsgiApp | None:
        try:
            app = await pending
        except Exception:
            self._count(route, "threads")  # where the server hands a request whose answer failed on its loop
            raise
        self._count(route, "from_owner" if app is not None else "threads")
        return app

    def _count(self, route: str, answered: str) -> None:
        if self.metrics is not None:
            self.metrics.loop_request(route, answered)

    def body_cap(self, path: str) -> int | None:
        """The most bytes a request body to ``path`` may have (--max-body-bytes; None: no cap)."""
        return None if path == _INTERNAL or path.startswith(_INTERNAL + "/") else self.limits.max_body_bytes

    def too_large(self, size: str) -> WsgiApp:
        """POST /v1/sql's 413 for a body over the cap."""
        return error_response(self.limits.body_too_large(size))


class _Refused:
    """BearerAuth's refusal as a WSGI app."""

    def __init__(self, err: SqlError) -> None:
        self.err = err

    def __call__(self, env: dict[str, Any], start_response: Any) -> list[bytes]:
        return wsgi_error(self.err, start_response)


def _no_app(env: dict[str, Any], start_response: Any) -> list[bytes]:
    raise AssertionError("only BearerAuth.refusal is used here")
