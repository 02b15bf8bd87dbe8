"""How a streamed CSV or Arrow answer says it failed after its first bytes were sent (the HTTP
status cannot change then): the marks the node's answers end with (federator.http.formats)
and what a client reads from them (``federator sql``). Only the standard library, as the
client installs no more."""

from __future__ import annotations

import csv

CSV_ERROR_FIELD = b'"federator_error",'
# An IPC message whose 8 metadata bytes are no valid flatbuffer: every Arrow reader stops on it.
ARROW_ERROR_MESSAGE = b"\xff\xff\xff\xff\x08\x00\x00\x00FEDERROR"


def failure_at_end(fmt: str, tail: bytes) -> str | None:
    """What went wrong, when a streamed CSV or Arrow body ends with the error mark above."""
    if fmt == "csv":
        line = tail.rstrip(b"\n").rpartition(b"\n")[2]
        if line.startswith(CSV_ERROR_FIELD):
            fields = next(csv.reader([line.decode("utf-8", "replace")]))
            return fields[1] if len(fields) > 1 else "the answer failed after it had started"
    if fmt == "arrow" and tail.endswith(ARROW_ERROR_MESSAGE):
        return "the answer failed after it had started; ask again (the server log says why)"
    return None
