"""One Postgres connection's statements: session settings, no-op transactions, cursors, queries.

What tools send besides queries is answered here (``SET``/``SHOW``/``RESET``, ``BEGIN``/``COMMIT``
as no-ops, ``DECLARE``/``FETCH``/``CLOSE`` over a query's answer, ``DISCARD``/``DEALLOCATE``);
a query reading only the catalog goes to the catalog database, any other to the node's SQL
engine with the session's consistency options, as ``POST /v1/sql`` would run it.

Federator's options are session settings: ``federator.consistency_token`` (the bound of later
queries), ``federator.allow_stale``, ``federator.max_lag`` and ``statement_timeout`` (ms). After a
query, ``SHOW federator.consistency_token`` gives the token of its answer.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, TypeVar

import pyarrow as pa
from sqlglot import exp

from federator.cancel import Cancel
from federator.catalog.definition import StoreDefinition
from federator.errors import SqlError
from federator.pgwire import catalog as pgcat
from federator.pgwire import names
from federator.pgwire.catalog import PgCatalog
from federator.query.position import Position
from federator.sql.limits import admitted, limits_of
from federator.sql.result import SqlRequest, SqlResult

T = TypeVar("T")
DEFAULT_TIMEOUT_MS = 10_000
TOKEN = "federator.consistency_token"

# What a server reports at startup and SHOW answers; drivers read several of them.
DEFAULT_SETTINGS: dict[str, str] = {
    "server_version": pgcat.SERVER_VERSION, "server_version_num": "160000", "server_encoding": "UTF8",
    "client_encoding": "UTF8", "datestyle": "ISO, MDY", "intervalstyle": "postgres", "timezone": "UTC",
    "integer_datetimes": "on", "standard_conforming_strings": "on", "is_superuser": "off",
    "application_name": "", "search_path": '"$user", public', "statement_timeout": "0", "lock_timeout": "0",
    "transaction_isolation": "read committed", "default_transaction_isolation": "read committed",
    "transaction_read_only": "on", "default_transaction_read_only": "on", "extra_float_digits": "1",
    "max_identifier_length": "63", "max_index_keys": "32",
    "federator.allow_stale": "off", "federator.max_lag": "", TOKEN: "",
}
# the ones sent to the client as ParameterStatus after authentication (as Postgres does)
REPORTED = ("server_version", "server_encoding", "client_encoding", "datestyle", "intervalstyle", "timezone",
            "integer_datetimes", "standard_conforming_strings", "is_superuser", "application_name")
_DISPLAY = {"datestyle": "DateStyle", "intervalstyle": "IntervalStyle", "timezone": "TimeZone"}
# settings SHOW takes under the SQL standard's spelling (pgcli asks SHOW TIME ZONE on connect)
_SHOW_ALIASES = {"time zone": "timezone", "transaction isolation level": "transaction_isolation"}


def display_name(name: str) -> str:
    return _DISPLAY.get(name, name)


@dataclass
class Answer:
    """What one statement gives the client: rows (schema and batches) or only a command tag."""

    tag: str  # the command tag; for rows, without the count ("SELECT", "FETCH")
    schema: pa.Schema | None = None
    batches: Iterator[pa.RecordBatch] = field(default_factory=lambda: iter(()))

    @property
    def has_rows(self) -> bool:
        return self.schema is not None


def _rows(tag: str, table: pa.Table) -> Answer:
    return Answer(tag, table.schema, iter(table.to_batches()))


def _one_value(name: str, value: str) -> Answer:
    return _rows("SHOW", pa.table({name: pa.array([value], pa.string())}))


@dataclass
class Cursor:
    schema: pa.Schema
    rows: Iterator[pa.RecordBatch]
    pending: pa.Table | None = None  # rows of a batch that a FETCH did not take

    def take(self, n: int | None) -> pa.Table:
        """The next ``n`` rows (all with None)."""
        parts, wanted = [], n
        while wanted is None or wanted > 0:
            if self.pending is None or self.pending.num_rows == 0:
                batch = next(self.rows, None)
                if batch is None:
                    break
                self.pending = pa.Table.from_batches([batch], schema=self.schema)
            take = self.pending.num_rows if wanted is None else min(wanted, self.pending.num_rows)
            parts.append(self.pending.slice(0, take))
            self.pending = self.pending.slice(take)
            if wanted is not None:
                wanted -= take
        return pa.concat_tables(parts) if parts else self.schema.empty_table()


_SET = re.compile(r"^SET\s+(?:SESSION\s+|LOCAL\s+)?(?:(?P<tz>TIME\s+ZONE)\s+(?P<tzvalue>.+)|(?P<name>[\w.]+)\s*(?:=|\s+TO\s+)\s*(?P<value>.+))$", re.I | re.S)
_RESET = re.compile(r"^RESET\s+(?P<name>[\w.]+)$", re.I)
_SHOW = re.compile(r"^SHOW\s+(?P<name>[\w. ]+)$", re.I)
_QUOTED = r'"(?:[^"]|"")+"'  # a quoted name
_DECLARE = re.compile(r"^DECLARE\s+(?P<name>\w+|" + _QUOTED + r")\s+(?:(?:BINARY|INSENSITIVE|ASENSITIVE|NO\s+SCROLL|SCROLL)\s+)*CURSOR\s+"
                      r"(?:(?:WITH|WITHOUT)\s+HOLD\s+)?FOR\s+(?P<query>.+)$", re.I | re.S)
_FETCH = re.compile(r"^(?P<verb>FETCH|MOVE)\s+(?:(?P<dir>NEXT|FORWARD|ALL|FORWARD\s+ALL|\d+|FORWARD\s+\d+)\s+)?"
                    r"(?:(?:FROM|IN)\s+)?(?P<name>\w+|" + _QUOTED + r")$", re.I)
_CLOSE = re.compile(r"^CLOSE\s+(?P<name>\w+|" + _QUOTED + r")$", re.I)
_TRANSACTION = {"begin": "BEGIN", "start": "START TRANSACTION", "commit": "COMMIT", "end": "COMMIT",
                "rollback": "ROLLBACK", "abort": "ROLLBACK", "savepoint": "SAVEPOINT", "release": "RELEASE"}
_NO_OPS = {"discard": "DISCARD ALL", "deallocate": "DEALLOCATE", "listen": "LISTEN", "unlisten": "UNLISTEN"}
_SHOW_ENGINE = {"tables", "columns", "databases", "schemas"}  # SHOW TABLES and friends: the engine's


def _cursor_name(raw: str) -> str:
    return raw[1:-1].replace('""', '"') if raw.startswith('"') else raw.lower()


class Session:
    def __init__(self, service: Any, pg_catalog: PgCatalog, user: str, pid: int,
                 startup: dict[str, str] | None = None) -> None:
        self.service, self.catalog, self.user, self.pid = service, pg_catalog, user, pid
        self.settings = dict(DEFAULT_SETTINGS)
        self.status = "I"  # ReadyForQuery's transaction status: I idle, T in a transaction, E failed
        self.cursors: dict[str, Cursor] = {}
        self.current = Cancel()  # the running statement's cancel switch (a cancel request pulls it)
        self._answer_token: str | None = None
        for name, value in (startup or {}).items():
            if name in ("user", "database", "replication"):
                continue
            if name == "options":  # psql's PGOPTIONS: -c name=value ...
                for m in re.finditer(r"-c\s*([\w.]+)=(\S+)", value):
                    self.set(m.group(1), m.group(2))
                continue
            self.set(name, value)

    def new_statement(self) -> None:
        self.current = Cancel()

    def cancel(self) -> None:
        self.current.cancel()

    # ---- settings ------------------------------------------------------------------------
    def set(self, name: str, value: str) -> None:
        name = name.lower()
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1].replace(value[0] * 2, value[0])
        if value.upper() == "DEFAULT":
            self.settings[name] = DEFAULT_SETTINGS.get(name, "")
            return
        if name == "federator.allow_stale":
            if value.lower() not in ("on", "off", "true", "false", "1", "0", "yes", "no"):
                raise SqlError("INVALID_PARAMETER", f"federator.allow_stale must be on or off, not {value!r}")
        elif name in ("federator.max_lag", "statement_timeout") and value:
            digits = value[:-2] if name == "statement_timeout" and value.endswith("ms") else value
            if not digits.isdigit():
                raise SqlError("INVALID_PARAMETER", f"{name} must be a whole number"
                                                    f"{' of milliseconds' if name == 'statement_timeout' else ''}, not {value!r}")
            value = digits
        self.settings[name] = value
        if name == TOKEN:
            self._answer_token = None  # SHOW gives the bound just set until a query answers

    def _options(self) -> tuple[str | None, bool, int | None, int]:
        token = self.settings.get(TOKEN) or None
        stale = self.settings.get("federator.allow_stale", "off").lower() in ("on", "true", "1", "yes")
        lag = self.settings.get("federator.max_lag") or None
        timeout = int(self.settings.get("statement_timeout") or 0) or DEFAULT_TIMEOUT_MS
        return token, stale, int(lag) if lag else None, timeout

    # ---- statements ----------------------------------------------------------------------
    def execute(self, sql: str, parameters: list[Any] | None = None) -> Answer:
        text = sql.strip().rstrip(";").strip()
        if not text:
            return Answer("")  # EmptyQueryResponse
        word = text.split(None, 1)[0].lower()
        if self.status == "E" and word not in ("rollback", "abort", "commit", "end"):
            raise SqlError("INVALID_PARAMETER", "current transaction is aborted, commands ignored until end of "
                                                "transaction block; send ROLLBACK")
        if word in _TRANSACTION:
            return self._transaction(word, text)
        if word in _NO_OPS:
            if word == "discard":
                self.cursors.clear()
            return Answer(_NO_OPS[word] if word != "discard" else "DISCARD ALL")
        if word == "set":
            return self._set(text)
        if word == "reset":
            m = _RESET.match(text)
            if m is None:
                raise SqlError("SQL_PARSE_ERROR", "expected RESET name or RESET ALL")
            if m.group("name").lower() == "all":
                self.settings = dict(DEFAULT_SETTINGS)
            else:
                self.settings[m.group("name").lower()] = DEFAULT_SETTINGS.get(m.group("name").lower(), "")
            return Answer("RESET")
        if word == "show":
            m = _SHOW.match(text)
            if m is not None and m.group("name").split()[0].lower() not in _SHOW_ENGINE:
                return self._show(m.group("name"))
        if word == "declare":
            return self._declare(text, parameters or [])
        if word in ("fetch", "move"):
            return self._fetch(text)
        if word == "close":
            m = _CLOSE.match(text)
            if m is None:
                raise SqlError("SQL_PARSE_ERROR", "expected CLOSE cursor_name or CLOSE ALL")
            if m.group("name").lower() == "all":
                self.cursors.clear()
            elif self.cursors.pop(_cursor_name(m.group("name")), None) is None:
                raise SqlError("INVALID_PARAMETER", f"cursor {m.group('name')!r} does not exist")
            return Answer("CLOSE CURSOR")
        return self.query(text, parameters or [])

    def _transaction(self, word: str, text: str) -> Answer:
        # Stores are read-only here: a transaction holds nothing, so its statements only keep
        # the status a driver checks.
        if word in ("begin", "start"):
            self.status = "T"
        elif word in ("commit", "end"):
            tag = "ROLLBACK" if self.status == "E" else "COMMIT"
            self.status = "I"
            return Answer(tag)
        elif word in ("rollback", "abort"):
            if re.match(r"^ROLLBACK\s+(?:WORK\s+|TRANSACTION\s+)?TO\b", text, re.I):
                self.status = "T" if self.status == "E" else self.status
                return Answer("ROLLBACK")
            self.status = "I"
        return Answer(_TRANSACTION[word])

    def fail(self) -> None:
        """A statement failed: inside a transaction block, later ones are refused until ROLLBACK."""
        if self.status == "T":
            self.status = "E"

    def _set(self, text: str) -> Answer:
        if re.match(r"^SET\s+(?:SESSION\s+CHARACTERISTICS|TRANSACTION)\b", text, re.I):
            return Answer("SET")
        m = _SET.match(text)
        if m is None:
            raise SqlError("SQL_PARSE_ERROR", f"cannot read {text!r}; write SET name = value or SET name TO value")
        if m.group("tz"):
            self.set("timezone", m.group("tzvalue"))
        else:
            self.set(m.group("name"), m.group("value"))
        return Answer("SET")

    def _show(self, name: str) -> Answer:
        key = " ".join(name.lower().split())
        if key == "all":
            names = sorted(self.settings)
            return _rows("SHOW", pa.table({"name": names, "setting": [self._setting(n) for n in names],
                                           "description": [""] * len(names)}))
        key = _SHOW_ALIASES.get(key, key)
        if key not in self.settings:
            raise SqlError("INVALID_PARAMETER", f"unrecognized configuration parameter {name!r}; SHOW ALL lists them")
        return _one_value(display_name(key.split(".")[-1]) if key != TOKEN else TOKEN, self._setting(key))

    def _setting(self, name: str) -> str:
        if name == TOKEN and self._answer_token is not None:
            return self._answer_token
        return self.settings.get(name, "")

    def _declare(self, text: str, parameters: list[Any]) -> Answer:
        m = _DECLARE.match(text)
        if m is None:
            raise SqlError("SQL_PARSE_ERROR", "expected DECLARE name CURSOR FOR query")
        answer = self.query(m.group("query"), parameters)
        assert answer.schema is not None
        self.cursors[_cursor_name(m.group("name"))] = Cursor(answer.schema, answer.batches)
        return Answer("DECLARE CURSOR")

    def _fetch(self, text: str) -> Answer:
        m = _FETCH.match(text)
        if m is None:
            raise SqlError("SQL_PARSE_ERROR", "expected FETCH [n | ALL | NEXT | FORWARD n] [FROM] cursor_name")
        cursor = self.cursors.get(_cursor_name(m.group("name")))
        if cursor is None:
            raise SqlError("INVALID_PARAMETER", f"cursor {m.group('name')!r} does not exist; DECLARE it first")
        direction = (m.group("dir") or "next").lower().replace("forward", "").strip() or "1"
        n = None if direction == "all" else 1 if direction == "next" else int(direction)
        table = cursor.take(n)
        if m.group("verb").lower() == "move":
            return Answer(f"MOVE {table.num_rows}")
        return _rows("FETCH", table)

    # ---- queries -------------------------------------------------------------------------
    def route(self, sql: str) -> Route:
        """Where ``sql`` runs: the catalog database (it reads no store), the node's SQL engine (it
        reads stores and nothing of the catalog) or both (stores read by the engine, the statement
        in the catalog database over their rows)."""
        tree = pgcat.parse(sql)
        if tree is None or not isinstance(tree, exp.Query):
            return Route("engine", sql)
        rewritten = pgcat.rewrite(tree.copy(), self.settings, self.user, self.pid)
        stores, catalog = names.relations(rewritten, self.service.stores, names.CATALOG_SCHEMAS | {pgcat.FIX})
        if not stores:
            return Route("catalog", rewritten.sql(dialect="duckdb"))
        if not catalog and not names.calls_functions_of(rewritten, pgcat.FIX):
            return Route("engine", sql if rewritten == tree else rewritten.sql(dialect="postgres"))
        return Route("both", "", rewritten, stores)

    def describe(self, sql: str) -> tuple[list[int], pa.Schema | None]:
        """The parameter types and the answer's columns of ``sql`` (None: it answers no rows)."""
        text = sql.strip().rstrip(";").strip()
        word = text.split(None, 1)[0].lower() if text else ""
        if word in ("show",) and not (text.split()[1:2] and text.split()[1].lower() in _SHOW_ENGINE):
            return [], self.execute(text).schema
        if word in ("fetch",):
            return [], None  # the cursor's columns arrive with its rows
        if not text or word in _TRANSACTION or word in _NO_OPS or word in ("set", "reset", "declare", "close", "move"):
            return [], None
        tree = pgcat.parse(text)
        if tree is None:
            return _placeholders(text), None  # the engine says what is wrong when the statement runs
        try:
            return self.catalog.describe(pgcat.rewrite(tree, self.settings, self.user, self.pid))
        except SqlError:
            return _placeholders(text), None

    def query(self, sql: str, parameters: list[Any]) -> Answer:
        route = self.route(sql)
        limits = limits_of(self.service)
        limits.check_sql(sql)
        timeout_ms, _ = limits.timeout_ms(self._options()[3])
        cancel = self.current
        if route.where == "engine":
            result, batches = self._engine(route.sql, parameters, timeout_ms)
            self._answer_token = result.consistency_token
            return Answer("SELECT", result.schema, batches)
        relations: dict[str, pa.Table] = {}
        if route.where == "both":
            assert route.tree is not None
            relations = self._read_stores(route.tree, route.stores, timeout_ms)
            route = Route("catalog", route.tree.sql(dialect="duckdb"))
        table = _canceled(cancel, lambda: self.catalog.run(route.sql, parameters, timeout_ms / 1000, cancel,
                                                           relations))
        limits.check_rows(table.num_rows, table.nbytes)
        return _rows("SELECT", table)

    def _engine(self, sql: str, parameters: list[Any], timeout_ms: int) -> tuple[SqlResult, Iterator[pa.RecordBatch]]:
        """``sql`` run by the node's SQL engine with the session's options: its result, and its
        batches within the node's answer caps."""
        token, stale, lag, _ = self._options()
        cancel = self.current
        limits = limits_of(self.service)
        req = SqlRequest(sql, list(parameters), consistency_token=token, allow_stale=stale, max_lag=lag,
                         timeout_ms=timeout_ms, dialect="postgres", cancel=cancel)
        with admitted(self.service, req):
            result = _canceled(cancel, lambda: self.service.sql(req))
            capped = limits.capped(iter(result.batches))
            try:
                _canceled(cancel, capped.read_ahead)  # most failures, and an answer over a cap, surface before any row is sent
            except BaseException:
                capped.close()
                raise
        return result, _until_cancelled(self, capped)

    def _read_stores(self, tree: exp.Expression, stores: list[exp.Table], timeout_ms: int) -> dict[str, pa.Table]:
        """The rows of each store ``tree`` reads, whole, from the engine (which says when a name is
        no store); ``tree`` is made to read them under the names returned."""
        defined = {n.lower(): d for n, d in self.service.stores.items()}
        texts = [_store_read(t, defined.get(t.name.lower())) for t in stores]
        relations: dict[str, pa.Table] = {}
        read_as: dict[str, str] = {}  # the engine's statement -> its relation (a store read twice is read once)
        position = Position()
        for text in dict.fromkeys(texts):
            result, batches = self._engine(text, [], timeout_ms)
            read_as[text] = f"federator_store_{len(read_as)}"
            relations[read_as[text]] = pa.Table.from_batches(list(batches), result.schema)
            position = position.merge(Position.from_token(result.consistency_token))
        names.point_at(tree, stores, [exp.Table(this=exp.to_identifier(read_as[t], quoted=True)) for t in texts])
        self._answer_token = position.to_token()
        return relations


def _store_read(table: exp.Table, defn: StoreDefinition | None) -> str:
    """The engine's statement reading every column of the store ``table`` names (its pseudo-columns
    too); of an unknown name, one the engine answers with why there is no such store."""
    columns = [exp.column(f.name, quoted=True) for f in defn.arrow_schema()] if defn else [exp.Star()]
    named = exp.Table(**{k: table.args[k].copy() for k in ("this", "db", "catalog") if table.args.get(k) is not None})
    return exp.select(*columns).from_(named).sql(dialect="postgres")


@dataclass
class Route:
    where: str  # "catalog", "engine" or "both"
    sql: str  # what runs: DuckDB's dialect in the catalog database, Postgres's in the engine
    tree: exp.Expression | None = None  # with "both": the statement, rewritten for the catalog database
    stores: list[exp.Table] = field(default_factory=list)  # with "both": its store references


_CANCELED = "canceling statement due to user request"  # Postgres's words; psql and drivers show them


def _canceled(cancel: Cancel, run: Callable[[], T]) -> T:
    """``run()``; a statement interrupted by a cancel request says so, not that it timed out."""
    try:
        return run()
    except SqlError as e:
        if cancel.cancelled and e.code == "TIMEOUT":
            raise SqlError("TIMEOUT", _CANCELED) from None
        raise


def _until_cancelled(session: Session, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    cancel = session.current
    iterator = iter(batches)
    while True:
        if cancel.cancelled:
            raise SqlError("TIMEOUT", _CANCELED)
        batch = _canceled(cancel, lambda: next(iterator, None))
        if batch is None:
            return
        yield batch


def _placeholders(sql: str) -> list[int]:
    """Text parameters for each $n of a statement DuckDB could not describe."""
    numbers = [int(n) for n in re.findall(r"\$(\d+)", sql)]
    return [pgcat.pgt.VARCHAR] * (max(numbers) if numbers else 0)


def count_rows(tag: str, rows: int) -> str:
    return f"SELECT {rows}" if tag == "SELECT" else f"{tag} {rows}" if tag in ("FETCH",) else tag


_ids = itertools.count(1)


def next_pid() -> int:
    return next(_ids)
