"""PEP 249 exceptions, and the mapping from the service's error codes to them.

They are the driver's own hierarchy (PEP 249: ``Error`` is the base of every error the driver
raises), not federator.errors.FederatorError: they describe an answer received, whose code may be
one this driver does not know, or no code at all when nothing answered.

Every exception raised for an answer of the service carries that answer's ``code`` (e.g.
``UNKNOWN_STORE``), ``message``, and for SQL errors ``line``/``col``, so a caller can act on
the stable code rather than parse text.
"""

from __future__ import annotations

from typing import Any

from federator.errors import CODES


class Warning(Exception):  # noqa: A001 - the name PEP 249 asks for
    pass


class Error(Exception):
    """Base of every driver error. ``code`` is the service's error code, or None for
    failures that never got an answer (e.g. no node reachable)."""

    def __init__(self, message: str, *, code: str | None = None, status: int | None = None,
                 line: int | None = None, col: int | None = None, partitions: list | None = None,
                 retry_after: str | None = None) -> None:
        super().__init__(f"{code}: {message}" if code else message)
        self.message = message
        self.code = code
        self.status = status
        self.line = line
        self.col = col
        self.partitions = partitions
        self.retry_after = retry_after


class InterfaceError(Error):
    pass


class DatabaseError(Error):
    pass


class DataError(DatabaseError):
    pass


class OperationalError(DatabaseError):
    pass


class IntegrityError(DatabaseError):
    pass


class InternalError(DatabaseError):
    pass


class ProgrammingError(DatabaseError):
    pass


class NotSupportedError(DatabaseError):
    pass


# The service's codes, each to the class its row of federator.errors.CODES names. A code this
# driver does not know yet still raises a DatabaseError carrying it, so newer servers never crash
# older clients.
CODE_TO_CLASS: dict[str, type[Error]] = {code: globals()[row.dbapi] for code, row in CODES.items()}


def error_from_answer(status: int, body: Any, retry_after: str | None = None) -> Error:
    """The exception for an error answer: ``body`` is the decoded JSON (or None if it was not JSON)."""
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict) or not isinstance(err.get("code"), str):
        # Not the service's error shape (a proxy's page, a truncated body): say what came back.
        cls = OperationalError if status >= 500 else InterfaceError
        return cls(f"HTTP {status} without a Federator error body: {str(body)[:300]}", status=status)
    code = err["code"]
    cls = CODE_TO_CLASS.get(code, DatabaseError)
    return cls(str(err.get("message", "")), code=code, status=status, line=err.get("line"), col=err.get("col"),
               partitions=err.get("partitions"), retry_after=retry_after)
