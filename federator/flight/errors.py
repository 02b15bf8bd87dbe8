"""SQL errors as Flight errors: the HTTP code and message, with the gRPC status a client maps to
the matching DB-API exception (ADBC: INVALID_ARGUMENT/NOT_FOUND -> ProgrammingError,
UNIMPLEMENTED -> NotSupportedError, UNAVAILABLE/DEADLINE_EXCEEDED -> OperationalError). gRPC has no
Retry-After: a TOO_MANY_QUERIES (HTTP 429) is UNAVAILABLE, which clients retry with backoff."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.flight as flight

from federator.errors import SqlError


def flight_error(err: SqlError) -> Exception:
    """The exception a handler raises for ``err``; its message starts with the code, as in HTTP."""
    message = f"{err.code}: {err.message}"
    detail = json.dumps(err.to_dict()).encode()  # the HTTP error body, for clients that read it
    status = err.status
    if status in (409, 429, 503):  # NOT_UP_TO_BOUND, TOO_MANY_QUERIES, UNAVAILABLE: worth retrying
        return flight.FlightUnavailableError(message, detail)
    if status == 504:
        return flight.FlightTimedOutError(message, detail)
    if status == 404:
        return pa.lib.ArrowKeyError(message)  # gRPC NOT_FOUND
    if err.code == "ANSWER_TOO_LARGE":
        # a 422, but no missing feature: the statement must ask for less (LIMIT, a WHERE on the
        # key), which a client shows as its own error (ProgrammingError), not NotSupportedError
        return pa.lib.ArrowInvalid(message)
    if status == 422:
        return pa.lib.ArrowNotImplementedError(message)  # gRPC UNIMPLEMENTED
    if status in (400, 413):
        return pa.lib.ArrowInvalid(message)  # gRPC INVALID_ARGUMENT
    return flight.FlightInternalError(message, detail)
