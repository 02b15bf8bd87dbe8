"""The HTTP side of authentication: public requests need ``Authorization: Bearer <token>``
of a user in the node's users file (federator.auth) when it has one.

Open without a token: the console's files (a page and its script, no data: the page asks
for a token and sends it with its API calls), health and readiness (for probes), metrics
(for Prometheus), and ``/internal/`` (node-to-node calls, which the cluster secret guards).
"""

from __future__ import annotations

import json
from typing import Any, Callable, Iterable

from federator.auth import Users, bearer

_OPEN = frozenset({"/", "/healthz", "/readyz", "/metrics", "/openapi.json"})
_OPEN_PREFIXES = ("/console/", "/internal/")
USER_KEY = "federator.user"  # the WSGI environ key the authenticated user's name is put under


def needs_token(path: str) -> bool:
    return path not in _OPEN and not path.startswith(_OPEN_PREFIXES) and path != "/internal"


class BearerAuth:
    """WSGI middleware: a public request without a valid bearer token gets a 401 JSON error."""

    def __init__(self, app: Callable[..., Iterable[bytes]], users: Users) -> None:
        self.app, self.users = app, users

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        if needs_token(environ.get("PATH_INFO", "")):
            token = bearer(environ.get("HTTP_AUTHORIZATION"))
            if token is None:
                return _unauthorized(start_response, _NO_TOKEN)
            login = self.users.login(token, environ.get("REMOTE_ADDR") or "unknown")
            if login.retry_after:
                return _refused(start_response, "429 TOO MANY REQUESTS", "TOO_MANY_FAILED_LOGINS", login.refusal(),
                                ("Retry-After", str(max(1, round(login.retry_after)))))
            if login.user is None:
                return _unauthorized(start_response, login.refusal())
            environ[USER_KEY] = login.user
        return self.app(environ, start_response)


_NO_TOKEN = ("this node needs a bearer token: send 'Authorization: Bearer <token>' (the DB-API driver's "
             "auth_token, `federator sql --auth-token` or $FEDERATOR_AUTH_TOKEN); `federator users add NAME "
             "--users-file FILE` makes a token")


def _unauthorized(start_response: Any, message: str) -> list[bytes]:
    return _refused(start_response, "401 UNAUTHORIZED", "UNAUTHENTICATED", message,
                    ("WWW-Authenticate", 'Bearer realm="federator"'))


def _refused(start_response: Any, status: str, code: str, message: str, header: tuple[str, str]) -> list[bytes]:
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(body))), header])
    return [body]
