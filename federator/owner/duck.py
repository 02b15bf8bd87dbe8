"""DuckDB, sandboxed: the engine that evaluates SQL over the Arrow rows the stores return.

One in-memory database per node. User SQL never reaches files, the network or extensions
(external access off, no extension autoload or install, configuration locked), memory is
capped with spill to a directory under the node's state dir, and a query past its deadline
is interrupted. Each query runs on its own cursor, which sees only the relations
registered on it, so concurrent queries cannot see each other's rows.
"""

from __future__ import annotations

import heapq
import itertools
import re
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import duckdb
import pyarrow as pa

from federator.cancel import Cancel
from federator.owner.duck_types import typed_schema
from federator.errors import SqlError
from federator.settings import NodeSettings

DEFAULT_MEMORY_LIMIT = NodeSettings.duckdb_memory_limit


@dataclass(frozen=True)
class DuckConfig:
    memory_limit: str = DEFAULT_MEMORY_LIMIT
    spill_dir: Path | None = None  # None: a temporary directory
    threads: int = 2


class Duck:
    """The node's DuckDB database; ``cursor()`` for a query's own connection."""

    def __init__(self, config: DuckConfig = DuckConfig()) -> None:
        spill = config.spill_dir or Path(tempfile.mkdtemp(prefix="federator-spill-"))
        spill.mkdir(parents=True, exist_ok=True)
        self.config = config
        try:
            self._db = duckdb.connect(":memory:", config={
                "enable_external_access": False,
                "autoload_known_extensions": False,
                "autoinstall_known_extensions": False,
                "memory_limit": config.memory_limit,
                "temp_directory": str(spill),
                "threads": config.threads,
            })
        except duckdb.Error as e:
            raise ValueError(f"DuckDB refused memory limit {config.memory_limit!r} (--duckdb-memory-limit): "
                             f"{_message(e)}; give a size such as 512MB or 4GB") from None
        self._db.execute("SET GLOBAL TimeZone = 'UTC'")  # answers must not depend on the machine's zone
        self._db.execute("SET lock_configuration = true")
        self._local = threading.local()

    def cursor(self) -> duckdb.DuckDBPyConnection:
        return self._db.cursor()

    def local_cursor(self) -> duckdb.DuckDBPyConnection:
        """This thread's cursor, kept for the small per-partition queries owners run."""
        cur = getattr(self._local, "cursor", None)
        if cur is None:
            cur = self._local.cursor = self._db.cursor()
        return cur

    def memory(self) -> tuple[int, int]:
        """(bytes in memory, bytes spilled to disk) that DuckDB holds now, for the node's metrics."""
        used, spilled = self.cursor().execute(
            "SELECT sum(memory_usage_bytes), sum(temporary_storage_bytes) FROM duckdb_memory()").fetchone()
        return int(used or 0), int(spilled or 0)

    def over(self, sql: str, relations: dict[str, pa.RecordBatch | pa.Table]) -> pa.RecordBatch:
        """Run ``sql`` over ``relations`` on this thread's cursor (an owner's part of a query):
        the answer as one record batch; DuckDB's errors as SqlError."""
        cur = self.local_cursor()
        for name, rows in relations.items():
            cur.register(name, rows)
        try:
            return one_batch(cur.sql(sql).to_arrow_table())
        except duckdb.Error as e:
            raise sql_error(e) from None
        finally:
            for name in relations:
                cur.unregister(name)

    def over_rows(self, sql: str, rows: pa.RecordBatch | pa.Table, name: str = "rows") -> pa.RecordBatch:
        """Run ``sql``, which reads the relation ``name``, over ``rows``."""
        return self.over(sql, {name: rows})

    def stream(self, sql: str, relations: dict[str, pa.Table], deadline: float | None,
               batch_rows: int = 65_536, cancel: Cancel | None = None,
               typed: bool = False) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
        """Run ``sql`` over ``relations`` on a cursor of its own: the answer's schema and its
        batches as DuckDB makes them. Errors come as SqlError; most before this returns (the
        first batch is made here), the rest while the batches are read. ``cancel`` interrupts
        the statement as the deadline does. ``typed``: the schema says the DuckDB types Arrow's
        own lose (federator.owner.duck_types.typed_schema); the batches are as ever."""
        cur = self.cursor()
        timer = None
        forget = cancel.on_cancel(cur.interrupt) if cancel is not None else None
        try:
            for name, table in relations.items():
                cur.register(name, table)
            if deadline is not None:
                timer = _INTERRUPTER.watch(deadline, cur)
            relation = cur.sql(sql)
            types = [str(t) for t in relation.types] if typed else None
            reader = relation.to_arrow_reader(batch_rows)
            first = _next(reader)
        except (duckdb.Error, pa.ArrowException, OSError) as e:  # DuckDB's errors may come through Arrow's reader
            _stop(timer, cur)
            _forget(forget)
            raise sql_error(e) from None
        except BaseException:
            _stop(timer, cur)
            _forget(forget)
            raise
        schema = reader.schema if types is None else typed_schema(reader.schema, types)
        if first is None:
            _stop(timer, cur)
            _forget(forget)
            return schema, iter(())

        def rest() -> Iterator[pa.RecordBatch]:
            try:
                batch: pa.RecordBatch | None = first
                while batch is not None:
                    yield batch
                    batch = _next(reader)
            except (duckdb.Error, pa.ArrowException, OSError) as e:
                raise sql_error(e) from None
            finally:
                _stop(timer, cur)
                _forget(forget)

        return schema, rest()


def _next(reader: pa.RecordBatchReader) -> pa.RecordBatch | None:
    try:
        return reader.read_next_batch()
    except StopIteration:
        return None


def one_batch(table: pa.Table) -> pa.RecordBatch:
    """``table`` as one record batch (the wire carries one per partition)."""
    table = table.combine_chunks()
    batches = table.to_batches()
    if not batches:
        return pa.RecordBatch.from_pylist([], schema=table.schema)
    return batches[0]


class _Interrupter:
    """One thread interrupts every statement that runs past its deadline: a timer thread per
    statement cost about half a millisecond, as much as a small statement itself."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, duckdb.DuckDBPyConnection]] = []
        self._live: set[int] = set()
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None

    def watch(self, deadline: float, cur: duckdb.DuckDBPyConnection) -> int:
        """Interrupt ``cur`` at ``deadline`` (time.monotonic()) unless ``done`` is called first."""
        with self._cond:
            handle = next(self._ids)
            heapq.heappush(self._heap, (deadline, handle, cur))
            self._live.add(handle)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="duckdb-deadlines", daemon=True)
                self._thread.start()
            self._cond.notify()
            return handle

    def done(self, handle: int) -> None:
        with self._cond:
            self._live.discard(handle)  # its heap entry is dropped when it comes up

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    while self._heap and self._heap[0][1] not in self._live:
                        heapq.heappop(self._heap)
                    if not self._heap:
                        self._cond.wait()
                        continue
                    deadline, handle, cur = self._heap[0]
                    wait = deadline - time.monotonic()
                    if wait <= 0:
                        heapq.heappop(self._heap)
                        self._live.discard(handle)
                        break
                    self._cond.wait(wait)
            cur.interrupt()


_INTERRUPTER = _Interrupter()


def _forget(forget: Callable[[], None] | None) -> None:
    if forget is not None:
        forget()


def _stop(timer: int | None, cur: duckdb.DuckDBPyConnection) -> None:
    if timer is not None:
        _INTERRUPTER.done(timer)
    try:
        cur.close()
    except duckdb.Error:
        pass


_LINE = re.compile(r"\n\s*\nLINE \d+:.*", re.S)
_PREFIX = re.compile(r"^[A-Za-z ]+ Error: ")


def _message(e: BaseException) -> str:
    text = _LINE.sub("", str(e)).strip()
    return _PREFIX.sub("", text, count=1)


# DuckDB's exception classes → our codes (the contract: 400 bad SQL or data, 404 unknown
# names, 422 refused, 504 timeout). Checked in order: the subclasses first.
_CODES: list[tuple[type[BaseException], str]] = [
    (duckdb.InterruptException, "TIMEOUT"),
    (duckdb.PermissionException, "UNSUPPORTED"),
    (duckdb.NotImplementedException, "UNSUPPORTED"),
    (duckdb.OutOfMemoryException, "UNSUPPORTED"),
    (duckdb.ParserException, "SQL_PARSE_ERROR"),
    (duckdb.ConversionException, "INVALID_DATA"),
    (duckdb.OutOfRangeException, "INVALID_DATA"),
    (duckdb.InvalidInputException, "INVALID_DATA"),
    (duckdb.ConstraintException, "INVALID_DATA"),
    (duckdb.DataError, "INVALID_DATA"),
    (duckdb.BinderException, "SQL_PARSE_ERROR"),
    (duckdb.CatalogException, "SQL_PARSE_ERROR"),
    (duckdb.TypeMismatchException, "SQL_PARSE_ERROR"),
    (duckdb.ProgrammingError, "SQL_PARSE_ERROR"),
]

_UNKNOWN_COLUMN = re.compile(r'Referenced column "([^"]+)" not found|column "([^"]+)" not found', re.I)


def sql_error(e: BaseException) -> SqlError:
    """The SqlError a user gets for a DuckDB error: its code, and DuckDB's own words."""
    message = _message(e)
    if not isinstance(e, duckdb.Error):  # raised through the Arrow stream: classify by its text
        for name, code in (("INTERRUPT", "TIMEOUT"), ("Interrupt", "TIMEOUT"), ("Conversion Error", "INVALID_DATA"),
                           ("Out of Range Error", "INVALID_DATA"), ("Invalid Input Error", "INVALID_DATA"),
                           ("Out of Memory Error", "UNSUPPORTED")):
            if name in str(e):
                return SqlError(code, message + _HINTS[code])
        return SqlError("INTERNAL", f"{type(e).__name__}: {message}")
    if isinstance(e, duckdb.BinderException) and _UNKNOWN_COLUMN.search(str(e)):
        return SqlError("UNKNOWN_COLUMN", message)
    if isinstance(e, duckdb.OutOfMemoryException):
        return SqlError("UNSUPPORTED", f"{message}; the query needs more memory than this node allows "
                                       "(--duckdb-memory-limit): filter or aggregate more, or raise the limit")
    for cls, code in _CODES:
        if isinstance(e, cls):
            return SqlError(code, message + _HINTS.get(code, ""))
    return SqlError("INTERNAL", message)


_HINTS = {
    "TIMEOUT": "; the query ran past timeout_ms: raise timeout_ms or narrow the query",
    "UNSUPPORTED": "",
    "INVALID_DATA": "",
    "SQL_PARSE_ERROR": "",
}
