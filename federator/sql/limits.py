"""Limits and admission for a node's public query entries (``POST /v1/sql``, the key lookup
route, Flight SQL statements): the request body and SQL text caps, the answer's row and byte
caps, the server maximum of ``timeout_ms``, and how many queries run at once.

Node-to-node calls (``/internal/...``) never pass through here: a query on node A waits on
them at node B, so refusing them for B's own public load could leave A and B waiting on each
other. Admission also keeps public queries from taking every HTTP thread (``--threads``): the
node refuses to start unless running + queued queries leave threads for those calls.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import pyarrow as pa

from federator.errors import SqlError
from federator.sql.guard import MAX_SQL_CHARS
from federator.sql.result import SqlRequest
from federator.settings import NodeSettings

MiB = 1024 * 1024
# The defaults are the node's settings' (federator.settings). Two running at once: a node's Python
# runs one thread at a time, so more queries running together only take the GIL from each other and
# lengthen every quick query's tail (tests/bench/results.md); the rest wait in arrival order.
# DuckDB still spreads each statement over the cores.
DEFAULT_MAX_BODY_BYTES = NodeSettings.max_body_bytes
DEFAULT_MAX_TIMEOUT_MS = NodeSettings.max_timeout_ms
DEFAULT_MAX_ANSWER_ROWS = NodeSettings.max_answer_rows
DEFAULT_MAX_ANSWER_BYTES = NodeSettings.max_answer_bytes
DEFAULT_MAX_RUNNING = NodeSettings.max_running_queries
DEFAULT_MAX_QUEUED = NodeSettings.max_queued_queries
# HTTP threads that public queries may never take: node-to-node calls, health and metadata
RESERVED_THREADS = 2
# How much of an answer (as Arrow) is read before the first byte is sent: an answer over a cap
# within it is refused with a 422; one found over it later ends its streamed body with the error
READ_AHEAD_BYTES = 4 * MiB
RETRY_AFTER_S = 1.0

def _bytes(n: int) -> str:
    for unit, size in (("GiB", 1024**3), ("MiB", MiB), ("KiB", 1024)):
        if n >= size and n % size == 0:
            return f"{n:,} bytes ({n // size} {unit})"
    return f"{n:,} bytes"


@dataclass(frozen=True)
class Limits:
    """The caps of one node; 0 for the answer caps means none."""

    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_sql_chars: int = MAX_SQL_CHARS
    max_answer_rows: int = DEFAULT_MAX_ANSWER_ROWS
    max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES
    max_timeout_ms: int = DEFAULT_MAX_TIMEOUT_MS
    max_running: int = DEFAULT_MAX_RUNNING
    max_queued: int = DEFAULT_MAX_QUEUED

    def __post_init__(self) -> None:
        for flag, value, least in (("--max-body-bytes", self.max_body_bytes, 1), ("--max-sql-chars", self.max_sql_chars, 1),
                                   ("--max-answer-rows", self.max_answer_rows, 0),
                                   ("--max-answer-bytes", self.max_answer_bytes, 0),
                                   ("--max-timeout-ms", self.max_timeout_ms, 1),
                                   ("--max-running-queries", self.max_running, 1),
                                   ("--max-queued-queries", self.max_queued, 0)):
            if value < least:
                raise ValueError(f"{flag} must be {least} or more, got {value}")
        if self.max_sql_chars > MAX_SQL_CHARS:
            raise ValueError(f"--max-sql-chars can be at most {MAX_SQL_CHARS} (1 MiB, the parser's own bound), "
                             f"got {self.max_sql_chars}")

    @classmethod
    def of(cls, config: Any) -> Limits:
        """The limits a node's config names (fields it lacks or leaves None keep their defaults)."""
        names = {"max_body_bytes": "max_body_bytes", "max_sql_chars": "max_sql_chars",
                 "max_answer_rows": "max_answer_rows", "max_answer_bytes": "max_answer_bytes",
                 "max_timeout_ms": "max_timeout_ms", "max_running": "max_running_queries",
                 "max_queued": "max_queued_queries"}
        given = {field: getattr(config, attr, None) for field, attr in names.items()}
        return cls(**{field: value for field, value in given.items() if value is not None})

    def check_threads(self, threads: int) -> None:
        """Refuse a --threads that public queries could fill, leaving none for node-to-node calls."""
        public = self.max_running + self.max_queued
        if public + RESERVED_THREADS > threads:
            raise ValueError(
                f"--threads {threads} is too few for {self.max_running} running and {self.max_queued} queued queries "
                f"(--max-running-queries, --max-queued-queries): each holds an HTTP thread, and {RESERVED_THREADS} "
                f"must stay free for node-to-node calls, or two busy nodes could wait on each other; give --threads "
                f"{public + RESERVED_THREADS} or more, or lower the others")

    # ---- the request ------------------------------------------------------------------------
    def body_too_large(self, size: str) -> SqlError:
        return SqlError("REQUEST_TOO_LARGE", f"the request body is {size} bytes; this node accepts at most "
                                             f"{_bytes(self.max_body_bytes)} (--max-body-bytes): send a shorter "
                                             "statement, fewer parameters, or split the query")

    def check_sql(self, sql: str) -> None:
        if len(sql) > self.max_sql_chars:
            raise SqlError("SQL_TOO_LONG", f"the SQL is {len(sql):,} characters long; this node accepts at most "
                                           f"{self.max_sql_chars:,} (--max-sql-chars): split the query, or pass long "
                                           "value lists as parameters")

    def timeout_ms(self, requested: int) -> tuple[int, bool]:
        """The timeout a request runs with, and whether it asked for more than this node allows.

        A request asking for more is clamped, not refused: the timeout only bounds how long the
        caller waits, so a query that finishes within the cap gets the same answer, and one
        that does not is told the cap in its TIMEOUT error (see ``timed_out``)."""
        return (self.max_timeout_ms, True) if requested > self.max_timeout_ms else (requested, False)

    def timed_out(self, err: SqlError) -> SqlError:
        """A TIMEOUT of a request whose timeout_ms was clamped, saying that raising it will not help."""
        if err.code != "TIMEOUT":
            return err
        return SqlError("TIMEOUT", f"{err.message} (timeout_ms was capped at {self.max_timeout_ms:,}, this node's "
                                   "--max-timeout-ms: narrow the query, or page through it with LIMIT/OFFSET)",
                        partitions=err.partitions, retry_after=err.retry_after)

    # ---- the answer -------------------------------------------------------------------------
    def too_many_rows(self) -> SqlError:
        return _too_large(f"the answer has more than {self.max_answer_rows:,} rows, this node's cap "
                          f"(--max-answer-rows {self.max_answer_rows})")

    def too_many_bytes(self) -> SqlError:
        return _too_large(f"the answer is over {_bytes(self.max_answer_bytes)} as Arrow data, this node's cap "
                          f"(--max-answer-bytes {self.max_answer_bytes})")

    def check_rows(self, rows: int, nbytes: int) -> None:
        if self.max_answer_rows and rows > self.max_answer_rows:
            raise self.too_many_rows()
        if self.max_answer_bytes and nbytes > self.max_answer_bytes:
            raise self.too_many_bytes()

    def capped(self, batches: Iterator[pa.RecordBatch]) -> CappedBatches:
        return CappedBatches(self, batches)


def _too_large(what: str) -> SqlError:
    return SqlError("ANSWER_TOO_LARGE", f"{what}; page through it: add ORDER BY with LIMIT n (then LIMIT n OFFSET n, "
                                        "...), or a WHERE on the store's key (key > the last key seen), or select "
                                        "fewer columns, or aggregate it")


class CappedBatches:
    """The batches as they come, raising ANSWER_TOO_LARGE once they pass a cap; ``read_ahead``
    takes the first ones before the answer starts, so a small cap is a clean 422."""

    def __init__(self, limits: Limits, batches: Iterator[pa.RecordBatch]) -> None:
        self.limits, self.source = limits, batches
        self.rows = self.nbytes = 0
        self._head: deque[pa.RecordBatch] = deque()

    def __iter__(self) -> CappedBatches:
        return self

    def __next__(self) -> pa.RecordBatch:
        if self._head:
            return self._head.popleft()
        return self._pull()

    def _pull(self) -> pa.RecordBatch:
        batch = next(self.source)
        self.rows += batch.num_rows
        self.nbytes += batch.nbytes
        self.limits.check_rows(self.rows, self.nbytes)
        return batch

    def read_ahead(self, budget: int | None = None) -> bool:
        """Read batches until ``budget`` bytes (READ_AHEAD_BYTES) are held, or the answer ends
        (True), or passes a cap (ANSWER_TOO_LARGE); the batches read come first from this iterator."""
        budget = READ_AHEAD_BYTES if budget is None else budget
        while self.nbytes < budget or not self._head:  # the first batch at least
            try:
                self._head.append(self._pull())
            except StopIteration:
                return True
        return False

    def close(self) -> None:
        close = getattr(self.source, "close", None)
        if close is not None:
            close()


class Admission:
    """At most ``max_running`` queries at once, and ``max_queued`` more waiting for a slot (in
    arrival order, each until its own deadline); beyond that, TOO_MANY_QUERIES (429)."""

    def __init__(self, max_running: int = DEFAULT_MAX_RUNNING, max_queued: int = DEFAULT_MAX_QUEUED) -> None:
        self.max_running, self.max_queued = max_running, max_queued
        self._lock = threading.Lock()
        self._running = 0
        # one plain lock per waiting query, held until a slot is handed to it: under load every
        # query waits, and an Event (a Condition in Python code) cost several times more
        self._waiting: deque[Any] = deque()

    @classmethod
    def of(cls, limits: Limits) -> Admission:
        return cls(limits.max_running, limits.max_queued)

    def state(self) -> dict[str, int]:
        with self._lock:
            return {"running": self._running, "queued": len(self._waiting),
                    "max_running": self.max_running, "max_queued": self.max_queued}

    def enter(self, timeout_s: float) -> Slot:
        """A slot, once one is free; ``timeout_s`` bounds the wait (the request's timeout_ms)."""
        started = time.monotonic()
        with self._lock:
            slot = self._free_slot()
            if slot is not None:
                return slot
            if len(self._waiting) >= self.max_queued:
                raise self._full()
            ready = threading.Lock()
            ready.acquire()
            self._waiting.append(ready)
        if not ready.acquire(timeout=max(0.0, timeout_s)):
            with self._lock:
                if ready in self._waiting:  # not handed a slot just as the wait ended
                    self._waiting.remove(ready)
                    raise self._waited(time.monotonic() - started)
        return Slot(self, time.monotonic() - started)

    def try_enter(self) -> Slot | None:
        """A slot if one is free now and nobody waits for one; else None, without waiting."""
        with self._lock:
            return self._free_slot()

    def _free_slot(self) -> Slot | None:  # under self._lock
        if self._running < self.max_running and not self._waiting:
            self._running += 1
            return Slot(self, 0.0)
        return None

    def _leave(self, slot: Slot) -> None:
        with self._lock:
            if not slot._held:  # released already
                return
            slot._held = False
            if self._waiting:
                self._waiting.popleft().release()  # the slot passes to the first waiting: still running
            else:
                self._running -= 1

    def _full(self) -> SqlError:
        return SqlError("TOO_MANY_QUERIES",
                        f"this node is running its most queries at once ({self.max_running}, --max-running-queries) "
                        f"and {self.max_queued} more are waiting (--max-queued-queries); retry after the "
                        "Retry-After header's seconds, or send the query to another node of the cluster",
                        retry_after=RETRY_AFTER_S)

    def _waited(self, seconds: float) -> SqlError:
        return SqlError("TOO_MANY_QUERIES",
                        f"the query waited {seconds * 1000:,.0f} ms, its whole timeout_ms, for one of this node's "
                        f"{self.max_running} query slots (--max-running-queries) and did not run; retry after the "
                        "Retry-After header's seconds, raise timeout_ms, or send it to another node of the cluster",
                        retry_after=RETRY_AFTER_S)


class Slot:
    """One admitted query's slot: ``release`` (any number of times) gives it back."""

    __slots__ = ("_admission", "waited_s", "_held")

    def __init__(self, admission: Admission, waited_s: float) -> None:
        self._admission, self.waited_s, self._held = admission, waited_s, True

    @property
    def waited_ms(self) -> int:
        return math.ceil(self.waited_s * 1000)

    def charge(self, req: SqlRequest) -> None:
        """Take the wait for this slot from ``req``'s timeout_ms: the caller waited it too."""
        if self.waited_s:
            req.timeout_ms = max(1, req.timeout_ms - self.waited_ms)

    def release(self) -> None:
        self._admission._leave(self)


DEFAULT_LIMITS = Limits()


def limits_of(node: Any) -> Limits:
    """The limits of ``node`` (a SqlService: the node's flags); the defaults for one without."""
    return getattr(node, "limits", None) or DEFAULT_LIMITS


def admit(node: Any, timeout_s: float) -> Slot | None:
    """A query slot of the node's admission (None for a node without one); TOO_MANY_QUERIES when
    its slots and queue are full, or the wait outlasts ``timeout_s``."""
    admission = getattr(node, "admission", None)
    return admission.enter(timeout_s) if admission is not None else None


@contextmanager
def admitted(node: Any, req: SqlRequest) -> Iterator[Slot | None]:
    """``req`` holding a slot of the node's admission for the block; the wait for the slot is
    taken from its timeout_ms."""
    slot = admit(node, req.timeout_ms / 1000)
    try:
        if slot is not None:
            slot.charge(req)
        yield slot
    finally:
        if slot is not None:
            slot.release()
