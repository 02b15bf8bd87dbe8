"""A DB-API cursor. Every statement is fetched as an Arrow IPC stream; fetch* turn it into
Python rows only when asked, so ``fetch_arrow_table()`` never converts a value."""

from __future__ import annotations

from typing import Any, Iterator, Protocol, Sequence

import pyarrow as pa

from federator.dbapi.errors import InterfaceError, NotSupportedError, ProgrammingError
from federator.dbapi.types import Description, describe, to_parameters

class Connection(Protocol):
    """What a cursor needs of its connection (federator.dbapi.connection.Connection)."""

    @property
    def closed(self) -> bool: ...

    def run(self, operation: str, parameters: list[Any]) -> tuple[pa.Table, str | None]: ...


class Cursor:
    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.arraysize = 1
        self.description: list[Description] | None = None
        self.rowcount = -1
        self.consistency_token: str | None = None  # the token of this cursor's last answer
        self._table: pa.Table | None = None
        self._rows: list[tuple] | None = None  # built from _table on the first fetch*
        self._pos = 0
        self._closed = False

    # ---- running statements ----------------------------------------------------------------

    def execute(self, operation: str, parameters: Sequence[Any] | None = None) -> Cursor:
        self._check_open()
        table, token = self.connection.run(operation, to_parameters(parameters))
        self._set_result(table, token)
        return self

    def executemany(self, operation: str, seq_of_parameters: Sequence[Sequence[Any]]) -> Cursor:
        """Runs the statement once per parameter set; the result is all their rows in order
        (for a read-only service, a batch of lookups is the one use of executemany)."""
        self._check_open()
        tables, token = [], None
        for params in seq_of_parameters:
            table, token = self.connection.run(operation, to_parameters(params))
            tables.append(table)
        if not tables:
            self._set_result(None, None)
            return self
        self._set_result(pa.concat_tables(tables, promote_options="default"), token)
        return self

    def _set_result(self, table: pa.Table | None, token: str | None) -> None:
        self._table, self._rows, self._pos = table, None, 0
        self.consistency_token = token
        self.description = describe(table.schema) if table is not None else None
        self.rowcount = table.num_rows if table is not None else -1

    # ---- fetching --------------------------------------------------------------------------

    def _result_rows(self) -> list[tuple]:
        self._check_open()
        if self._table is None:
            raise ProgrammingError("no result to fetch: call execute() first")
        if self._rows is None:
            columns = [col.to_pylist() for col in self._table.columns]
            self._rows = list(zip(*columns)) if columns else [()] * self._table.num_rows
        return self._rows

    def fetchone(self) -> tuple | None:
        rows = self._result_rows()
        if self._pos >= len(rows):
            return None
        self._pos += 1
        return rows[self._pos - 1]

    def fetchmany(self, size: int | None = None) -> list[tuple]:
        rows = self._result_rows()
        n = self.arraysize if size is None else size
        out = rows[self._pos:self._pos + n]
        self._pos += len(out)
        return out

    def fetchall(self) -> list[tuple]:
        rows = self._result_rows()
        out = rows[self._pos:]
        self._pos = len(rows)
        return out

    def fetch_arrow_table(self) -> pa.Table:
        """The rows not fetched yet, as the Arrow table the service sent (no conversion)."""
        self._check_open()
        if self._table is None:
            raise ProgrammingError("no result to fetch: call execute() first")
        out = self._table.slice(self._pos)
        self._pos = self._table.num_rows
        return out

    def __iter__(self) -> Iterator[tuple]:
        return self

    def __next__(self) -> tuple:
        row = self.fetchone()
        if row is None:
            raise StopIteration
        return row

    # ---- the rest of PEP 249 ----------------------------------------------------------------

    def close(self) -> None:
        self._closed = True
        self._table = self._rows = None

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise InterfaceError("the cursor is closed")
        if self.connection.closed:
            raise InterfaceError("the connection is closed")

    def setinputsizes(self, sizes: Any) -> None:
        pass

    def setoutputsize(self, size: Any, column: Any = None) -> None:
        pass

    def nextset(self) -> None:
        return None  # one result set per statement

    def callproc(self, procname: str, parameters: Sequence[Any] = ()) -> None:
        raise NotSupportedError("Federator has no stored procedures")

    @property
    def lastrowid(self) -> None:
        return None  # nothing is ever inserted

    def __enter__(self) -> Cursor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
