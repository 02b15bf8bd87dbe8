"""Errors as Flight errors: the gRPC status of the code's row (federator.errors), a message that
starts with the code as over HTTP, and the HTTP error body as the detail where gRPC carries one.
Clients map the status to a DB-API exception (ADBC: INVALID_ARGUMENT/NOT_FOUND -> ProgrammingError,
UNIMPLEMENTED -> NotSupportedError, UNAVAILABLE/DEADLINE_EXCEEDED -> OperationalError). gRPC has
no Retry-After: a TOO_MANY_QUERIES (HTTP 429) is UNAVAILABLE, which clients retry with backoff."""

from __future__ import annotations

from typing import Callable

import pyarrow as pa
import pyarrow.flight as flight

from federator.errors import FederatorError

# pyarrow raises a gRPC status from the exception a handler raises: Flight's own errors carry
# the detail bytes, Arrow's status errors only the message
_BY_GRPC: dict[str, Callable[[str, bytes], Exception]] = {
    "INVALID_ARGUMENT": lambda m, d: pa.lib.ArrowInvalid(m),
    "NOT_FOUND": lambda m, d: pa.lib.ArrowKeyError(m),
    "UNIMPLEMENTED": lambda m, d: pa.lib.ArrowNotImplementedError(m),
    "UNAVAILABLE": flight.FlightUnavailableError,
    "DEADLINE_EXCEEDED": flight.FlightTimedOutError,
    "UNAUTHENTICATED": flight.FlightUnauthenticatedError,
    "PERMISSION_DENIED": flight.FlightUnauthorizedError,
    "INTERNAL": flight.FlightInternalError,
}


def flight_error(err: FederatorError) -> Exception:
    """The exception a handler raises for ``err``; its message starts with the code, as in HTTP."""
    return _BY_GRPC[err.row.grpc](f"{err.code}: {err.message}", err.to_json())
