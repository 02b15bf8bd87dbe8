"""Errors over HTTP: any error as the body, status and headers its code's row says
(federator.errors), for the Flask routes and the WSGI middleware alike."""

from __future__ import annotations

import math
from http import HTTPStatus
from typing import Any

from werkzeug.wrappers import Response

from federator.errors import FederatorError, as_error


def error_headers(err: FederatorError) -> dict[str, str]:
    headers = {}
    if err.retry_after is not None:
        # Retry-After takes whole seconds; 0 would invite an immediate retry storm.
        headers["Retry-After"] = str(max(1, math.ceil(err.retry_after)))
    if err.code == "UNAUTHENTICATED":
        headers["WWW-Authenticate"] = 'Bearer realm="federator"'
    return headers


def error_response(e: BaseException) -> Response:
    """The answer for ``e``: a bug (anything not a FederatorError) is a 500 INTERNAL."""
    err = as_error(e)
    return Response(err.to_json(), status=err.status, mimetype="application/json", headers=error_headers(err))


def wsgi_error(e: BaseException, start_response: Any) -> list[bytes]:
    """The same answer from WSGI middleware, which runs before any request object exists."""
    err = as_error(e)
    body = err.to_json()
    start_response(f"{err.status} {HTTPStatus(err.status).phrase.upper()}",
                   [("Content-Type", "application/json"), ("Content-Length", str(len(body))),
                    *error_headers(err).items()])
    return [body]
