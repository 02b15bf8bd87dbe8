"""Federator's errors: the root class, and the one table of error codes.

Each code is declared once, in ``CODES``, with what every front door answers for it: the HTTP
status, the gRPC status of Flight SQL, the Postgres SQLSTATE and the PEP 249 exception class of
the DB-API driver. The front doors render an error from its row (federator.http.errors,
federator.flight.errors, federator.pgwire.server, federator.dbapi.errors); the OpenAPI document
and docs/reference/errors.md are made from it, so none of them can name a code it lacks.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ErrorCode:
    code: str
    http: int
    grpc: str  # the gRPC status name a Flight SQL client sees
    sqlstate: str  # the Postgres protocol's
    dbapi: str  # the PEP 249 exception class the DB-API driver raises
    meaning: str
    action: str  # what the caller does about it


# One entry a code: its name, HTTP status, gRPC status, SQLSTATE and PEP 249 class on one line;
# what it means on the lines below, and after "->" what the caller does about it. Ordered by
# HTTP status, then by how often a caller meets it.
_TABLE = """
SQL_PARSE_ERROR         400 INVALID_ARGUMENT  42601 ProgrammingError
    the SQL does not parse or bind; `line`/`col` when known
    -> fix the statement where the message points
INVALID_PARAMETER       400 INVALID_ARGUMENT  22023 ProgrammingError
    a request field, option or parameter is wrong; the message names it
    -> send the value the message asks for
INVALID_DATA            400 INVALID_ARGUMENT  22000 DataError
    the data made an expression fail: division by zero, overflow, a failed CAST
    -> guard the expression (NULLIF, TRY_CAST) or filter the rows out
INVALID_KEY             400 INVALID_ARGUMENT  22P02 ProgrammingError
    a key in the path does not parse as the store's key type
    -> send the key as the store's key format reads it
SQL_TOO_LONG            400 INVALID_ARGUMENT  54000 ProgrammingError
    the SQL is longer than the node's `--max-sql-chars`
    -> send a shorter statement (bind values as parameters)
BAD_REQUEST             400 INVALID_ARGUMENT  08P01 InterfaceError
    the request is not what the protocol expects (not JSON, a malformed message)
    -> use a client of this version; the message says what was wrong
UNAUTHENTICATED         401 UNAUTHENTICATED   28P01 OperationalError
    no bearer token, or not one of the node's users' (a node with `--users-file`)
    -> send the token `federator users add` printed (Postgres: as the password)
FORBIDDEN               403 PERMISSION_DENIED 28000 OperationalError
    the caller may not use this entry this way: an internal call without the cluster secret,
    Postgres without TLS on a node that requires it, or a login other than SCRAM-SHA-256
    -> pass the cluster secret, or connect as the message says
NOT_FOUND               404 NOT_FOUND         42704 InterfaceError
    no such endpoint or file
    -> see the OpenAPI document at /openapi.json for the routes
UNKNOWN_STORE           404 NOT_FOUND         42P01 ProgrammingError
    no such store; the message lists the stores
    -> use a store `SHOW TABLES` lists
UNKNOWN_COLUMN          404 NOT_FOUND         42703 ProgrammingError
    no such column
    -> use a column `DESCRIBE store` lists
KEY_NOT_FOUND           404 NOT_FOUND         P0002 ProgrammingError
    the store has no such key (a key lookup); `store` and `key` name it
    -> look up a key the store holds
METHOD_NOT_ALLOWED      405 UNIMPLEMENTED     0A000 InterfaceError
    the endpoint does not take this HTTP method
    -> use the method the message names
NOT_UP_TO_BOUND         409 UNAVAILABLE       55000 OperationalError
    no copy of a partition reached the request's consistency token in time
    -> retry, or allow a longer timeout_ms
REQUEST_TOO_LARGE       413 INVALID_ARGUMENT  54000 ProgrammingError
    the request body is over the node's `--max-body-bytes`
    -> send a smaller body
UNSUPPORTED             422 UNIMPLEMENTED     0A000 NotSupportedError
    a construct Federator does not run (named), or a statement that is not a read
    -> rewrite the statement as the message suggests
UNKNOWN_QUERY_TYPE      422 UNIMPLEMENTED     0A000 NotSupportedError
    a per-partition query type no plugin on a node provides
    -> install the plugin the message names on every node
ANSWER_TOO_LARGE        422 INVALID_ARGUMENT  54000 ProgrammingError
    the answer is over the node's `--max-answer-rows` or `--max-answer-bytes`
    -> ask for less: page with LIMIT/OFFSET or filter on the key
TOO_MANY_QUERIES        429 UNAVAILABLE       53300 OperationalError
    the node's query slots and queue are full
    -> retry after `Retry-After` seconds
TOO_MANY_FAILED_LOGINS  429 UNAUTHENTICATED   28000 OperationalError
    this address is shut out after repeated failed logins
    -> wait `Retry-After` seconds, then send a valid token
INTERNAL                500 INTERNAL          XX000 InternalError
    a bug: logged with its stack on the node
    -> report it with the message
UNAVAILABLE             503 UNAVAILABLE       57P03 OperationalError
    partitions without an owner that can answer; `partitions` names them
    -> retry after `Retry-After` seconds, or set allow_stale
TIMEOUT                 504 DEADLINE_EXCEEDED 57014 OperationalError
    past the request's `timeout_ms` (Postgres: also a cancel request)
    -> allow a longer timeout_ms, or ask for less
"""


def _parse(table: str) -> dict[str, ErrorCode]:
    entries = re.split(r"\n(?=\S)", table.strip())
    out = {}
    for entry in entries:
        head, _, text = entry.partition("\n")
        code, http, grpc, sqlstate, dbapi = head.split()
        meaning, _, action = " ".join(text.split()).partition(" -> ")
        out[code] = ErrorCode(code, int(http), grpc, sqlstate, dbapi, meaning, action)
    return out


CODES: dict[str, ErrorCode] = _parse(_TABLE)


class FederatorError(Exception):
    """Root of the errors Federator raises for a caller to see. ``code`` names its row of
    ``CODES``: a subclass sets its own, an instance may set another. ``fields`` are the body's
    extra members (``line``/``col``, ``partitions``, ``store``/``key``)."""

    code: str = "INTERNAL"
    retry_after: float | None = None  # seconds a client should wait before it retries

    def __init__(self, message: str = "", *, code: str | None = None, retry_after: float | None = None,
                 **fields: Any) -> None:
        super().__init__(message)
        if code is not None:
            if code not in CODES:
                raise ValueError(f"unknown error code {code!r}: declare it in federator.errors.CODES")
            self.code = code
        self.message = message
        if retry_after is not None:
            self.retry_after = retry_after
        self.fields = fields

    @property
    def row(self) -> ErrorCode:
        return CODES[self.code]

    @property
    def status(self) -> int:
        return self.row.http

    def to_dict(self) -> dict[str, Any]:
        """The error body every front door answers with: ``{"error": {"code", "message", ...}}``."""
        return {"error": {"code": self.code, "message": self.message, **self.fields}}

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), ensure_ascii=False, separators=(",", ":")).encode()


class SqlError(FederatorError):
    """An error answered to a request, at any front door: its code comes first."""

    def __init__(self, code: str, message: str, *, line: int | None = None, col: int | None = None,
                 partitions: list | None = None, retry_after: float | None = None, **fields: Any) -> None:
        where = {"line": line, "col": col} if line is not None else {}
        if partitions is not None:
            where["partitions"] = partitions
        super().__init__(message, code=code, retry_after=retry_after, **where, **fields)
        self.line, self.col, self.partitions = line, col, partitions


def as_error(e: BaseException) -> FederatorError:
    """``e`` as the error a front door answers with: a bug is INTERNAL, with its type named."""
    if isinstance(e, FederatorError):
        return e
    return SqlError("INTERNAL", f"{type(e).__name__}: {e}")


def unsupported(construct: str, hint: str = "") -> SqlError:
    msg = f"{construct} is not supported"
    return SqlError("UNSUPPORTED", f"{msg}; {hint}" if hint else msg)


def error_schema() -> dict[str, Any]:
    """The body's JSON Schema, for the OpenAPI document: the codes are the table's."""
    return {"type": "object", "required": ["error"], "properties": {"error": {
        "type": "object", "required": ["code", "message"], "properties": {
            "code": {"type": "string", "enum": list(CODES),
                     "description": "; ".join(f"{c}: {row.meaning}" for c, row in CODES.items())},
            "message": {"type": "string", "description": "what was wrong and what to do"},
            "line": {"type": "integer"}, "col": {"type": "integer"},
            "partitions": {"type": "array", "items": {"type": "integer"}},
            "store": {"type": "string"}, "key": {"type": "string"}}}}}


def markdown_table() -> str:
    """The table of codes as docs/reference/errors.md shows it (a MkDocs hook puts it there)."""
    lines = ["| Code | HTTP | Flight SQL (gRPC) | Postgres SQLSTATE | DB-API | Meaning | What to do |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| `{r.code}` | {r.http} | {r.grpc} | {r.sqlstate} | {r.dbapi} | {r.meaning} | {r.action} |"
              for r in CODES.values()]
    return "\n".join(lines)
