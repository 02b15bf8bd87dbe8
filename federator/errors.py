"""SQL errors: a stable code, the HTTP status it maps to, and a message a user can act on."""

from __future__ import annotations

STATUS = {
    "SQL_PARSE_ERROR": 400,
    "INVALID_PARAMETER": 400,
    "INVALID_DATA": 400,  # the data made an expression fail: division by zero, overflow, a failed CAST
    "SQL_TOO_LONG": 400,  # longer than the node's --max-sql-chars
    "REQUEST_TOO_LARGE": 413,  # a body over the node's --max-body-bytes
    "UNKNOWN_STORE": 404,
    "UNKNOWN_COLUMN": 404,
    "UNSUPPORTED": 422,
    "UNKNOWN_QUERY_TYPE": 422,
    "ANSWER_TOO_LARGE": 422,  # over the node's --max-answer-rows or --max-answer-bytes
    "TOO_MANY_QUERIES": 429,  # the node's query slots and queue are full (with Retry-After)
    "NOT_UP_TO_BOUND": 409,
    "UNAVAILABLE": 503,
    "TIMEOUT": 504,
    "INTERNAL": 500,
}


class SqlError(Exception):
    def __init__(
        self,
        code: str,
        message: str,
        *,
        line: int | None = None,
        col: int | None = None,
        partitions: list | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        if code not in STATUS:
            raise ValueError(f"unknown SQL error code {code!r}")
        self.code = code
        self.message = message
        self.line = line
        self.col = col
        self.partitions = partitions
        self.retry_after = retry_after

    @property
    def status(self) -> int:
        return STATUS[self.code]

    def to_dict(self) -> dict:
        err: dict = {"code": self.code, "message": self.message}
        if self.line is not None:
            err["line"] = self.line
            err["col"] = self.col
        if self.partitions is not None:
            err["partitions"] = self.partitions
        return {"error": err}


def unsupported(construct: str, hint: str = "") -> SqlError:
    msg = f"{construct} is not supported"
    return SqlError("UNSUPPORTED", f"{msg}; {hint}" if hint else msg)
