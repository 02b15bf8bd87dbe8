"""The HTTP side of authentication: public requests need ``Authorization: Bearer <token>``
of a user in the node's users file (federator.auth) when it has one.

Open without a token: the console's files (a page and its script, no data: the page asks
for a token and sends it with its API calls), health and readiness (for probes), metrics
(for Prometheus), and ``/internal/`` (node-to-node calls, which the cluster secret guards).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from federator.auth import Users, bearer
from federator.errors import SqlError
from federator.http.errors import wsgi_error

_OPEN = frozenset({"/", "/healthz", "/readyz", "/metrics", "/openapi.json"})
_OPEN_PREFIXES = ("/console/", "/internal/")
USER_KEY = "federator.user"  # the WSGI environ key the authenticated user's name is put under


def needs_token(path: str) -> bool:
    return path not in _OPEN and not path.startswith(_OPEN_PREFIXES) and path != "/internal"


class BearerAuth:
    """WSGI middleware: a public request without a valid bearer token gets a 401 UNAUTHENTICATED
    (429 TOO_MANY_FAILED_LOGINS while its address is shut out)."""

    def __init__(self, app: Callable[..., Iterable[bytes]], users: Users) -> None:
        self.app, self.users = app, users

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        refused = self.refusal(environ)
        if refused is not None:
            return wsgi_error(refused, start_response)
        return self.app(environ, start_response)

    def refusal(self, environ: dict[str, Any]) -> SqlError | None:
        """Why a request may not pass (None: it may; an authenticated user's name is put in
        ``environ`` under USER_KEY). Each failed login is counted once, here."""
        refused, user = self.check(environ.get("PATH_INFO", ""), environ.get("HTTP_AUTHORIZATION"),
                                   environ.get("REMOTE_ADDR"))
        if user is not None:
            environ[USER_KEY] = user
        return refused

    def check(self, path: str, authorization: str | None, address: str | None) -> tuple[SqlError | None, str | None]:
        """``refusal`` from the request's path, Authorization header and client address: why it
        may not pass, or the authenticated user's name (None for both: an open path)."""
        if not needs_token(path):
            return None, None
        token = bearer(authorization)
        if token is None:
            return SqlError("UNAUTHENTICATED", _NO_TOKEN), None
        login = self.users.login(token, address or "unknown")
        refused = login.error()
        return refused, login.user if refused is None else None


_NO_TOKEN = ("this node needs a bearer token: send 'Authorization: Bearer <token>' (the DB-API driver's "
             "auth_token, `federator sql --auth-token` or $FEDERATOR_AUTH_TOKEN); `federator users add NAME "
             "--users-file FILE` makes a token")
