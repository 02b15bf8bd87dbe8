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
            user = self.users.check(token) if token is not None else None
            if user is None:
                return _unauthorized(start_response, token is not None)
            environ[USER_KEY] = user
        return self.app(environ, start_response)


def _unauthorized(start_response: Any, had_token: bool) -> list[bytes]:
    if had_token:
        message = ("the bearer token is not one of this node's users'; send a token that "
                   "`federator users add` printed for a user in the node's --users-file")
    else:
        message = ("this node needs a bearer token: send 'Authorization: Bearer <token>' (the DB-API driver's "
                   "auth_token, `federator sql --auth-token` or $FEDERATOR_AUTH_TOKEN); `federator users add NAME "
                   "--users-file FILE` makes a token")
    body = json.dumps({"error": {"code": "UNAUTHENTICATED", "message": message}}).encode()
    start_response("401 UNAUTHORIZED", [("Content-Type", "application/json"), ("Content-Length", str(len(body))),
                                        ("WWW-Authenticate", 'Bearer realm="federator"')])
    return [body]
