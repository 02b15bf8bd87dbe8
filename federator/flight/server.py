"""Arrow Flight SQL on a node: a pyarrow.flight server answering the Flight SQL commands.

A statement runs through the node's SQL engine (``Node.sql``) at GetFlightInfo, so the FlightInfo
carries the real result schema and errors surface there with their codes; the batches wait under
a one-use ticket for DoGet. Catalog commands are cheap and stateless: their ticket is the command.
Per-call options travel as headers: ``x-federator-consistency-token``, ``x-federator-allow-stale``,
``x-federator-max-lag``, ``x-federator-timeout-ms``; the answer's token comes back as a header.
"""

from __future__ import annotations

import datetime as dt
import decimal
import functools
import logging
import threading
from typing import Any, Callable, Iterator, TypeVar

import pyarrow as pa
import pyarrow.flight as flight

from federator.auth import Users, bearer
from federator.tls import Tls
from federator.flight import metadata, protocol
from federator.flight.errors import flight_error
from federator.flight.statements import Expiring, PendingResult, PreparedStatement
from federator.errors import FederatorError, SqlError, as_error
from federator.sql.limits import DEFAULT_LIMITS, Limits, admitted, limits_of
from federator.sql.result import SqlRequest

log = logging.getLogger(__name__)

TOKEN_HEADER = "x-federator-consistency-token"
ALLOW_STALE_HEADER = "x-federator-allow-stale"
MAX_LAG_HEADER = "x-federator-max-lag"
TIMEOUT_HEADER = "x-federator-timeout-ms"
_MIDDLEWARE = "federator"
_AUTH = "auth"
MAX_BATCH_ROWS = 65_536  # keeps each Flight message well under gRPC's usual 4 MiB limits

F = TypeVar("F", bound=Callable[..., Any])


def _unsupported(what: str, hint: str = "") -> SqlError:
    return SqlError("UNSUPPORTED", f"{what} is not supported" + (f"; {hint}" if hint else ""))


def _translated(fn: F) -> F:
    """Handler errors as Flight errors carrying the HTTP code and message."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except FederatorError as e:  # a ProtocolError too: bytes that are not the message they should be
            raise flight_error(e) from None
        except flight.FlightError:
            raise
        except Exception as e:  # noqa: BLE001 - a bug must still answer as a typed INTERNAL error
            log.exception("Flight SQL %s failed", fn.__name__)
            raise flight_error(as_error(e)) from None

    return wrapper  # type: ignore[return-value]


def _rpc(fn: F) -> F:
    """A Flight RPC: answered to an authenticated caller only, its errors translated."""
    translated = _translated(fn)

    @functools.wraps(fn)
    def wrapper(server: FlightSqlServer, context: flight.ServerCallContext, *args: Any, **kwargs: Any) -> Any:
        server._authenticate(context)
        return translated(server, context, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


class CallOptions(flight.ServerMiddleware):
    """The SqlRequest options of one call, from its headers; collects the answer's token."""

    def __init__(self, headers: dict[str, list[Any]]) -> None:
        def one(name: str) -> str | None:
            values = headers.get(name) or []
            v = values[-1] if values else None
            return v.decode() if isinstance(v, bytes) else v

        self.token = one(TOKEN_HEADER) or None
        self._allow_stale, self._max_lag, self._timeout = one(ALLOW_STALE_HEADER), one(MAX_LAG_HEADER), one(TIMEOUT_HEADER)
        self.response_token: str | None = None
        self.timeout_capped_to: int | None = None  # the timeout header asked more than --max-timeout-ms

    def request(self, sql: str, parameters: list[Any], token: str | None = None,
                limits: Limits = DEFAULT_LIMITS) -> SqlRequest:
        allow_stale = (self._allow_stale or "false").strip().lower()
        if allow_stale not in ("true", "false", "1", "0"):
            raise SqlError("INVALID_PARAMETER", f"header {ALLOW_STALE_HEADER} must be true or false, got {self._allow_stale!r}")
        asked = _int_header(TIMEOUT_HEADER, self._timeout, 1, None)
        timeout_ms, capped = limits.timeout_ms(asked or 10_000)
        if capped and asked is not None:
            self.timeout_capped_to = timeout_ms
        return SqlRequest(sql=sql, parameters=parameters, consistency_token=token or self.token,
                          allow_stale=allow_stale in ("true", "1"),
                          max_lag=_int_header(MAX_LAG_HEADER, self._max_lag, 0, None), timeout_ms=timeout_ms)

    def sending_headers(self) -> dict[str, str]:
        headers = {TOKEN_HEADER: self.response_token} if self.response_token else {}
        if self.timeout_capped_to is not None:  # what the call ran with: the node's --max-timeout-ms
            headers[TIMEOUT_HEADER] = str(self.timeout_capped_to)
        return headers


def _int_header(name: str, value: str | None, minimum: int, default: int | None) -> int | None:
    if value is None or not value.strip():
        return default
    try:
        n = int(value)
    except ValueError:
        n = minimum - 1
    if n < minimum:
        raise SqlError("INVALID_PARAMETER", f"header {name} must be an integer of at least {minimum}, got {value!r}")
    return n


class _CallOptionsFactory(flight.ServerMiddlewareFactory):
    def start_call(self, info: flight.CallInfo, headers: dict[str, list[Any]]) -> CallOptions:
        return CallOptions(headers)


class _BearerToken(flight.ServerMiddleware):
    def __init__(self, token: str) -> None:
        self.token = token


class _BearerAuthFactory(flight.ServerMiddlewareFactory):
    """Every call needs ``authorization: Bearer <token>`` of a user in the node's users file
    (ADBC: the ``adbc.flight.sql.authorization_header`` option); gRPC's UNAUTHENTICATED else.
    The token is checked by the handler (``FlightSqlServer._authenticate``), which knows the peer."""

    def start_call(self, info: flight.CallInfo, headers: dict[str, list[Any]]) -> _BearerToken:
        values = headers.get("authorization") or []
        value = values[-1] if values else None
        token = bearer(value.decode() if isinstance(value, bytes) else value)
        if token is None:
            raise flight_error(SqlError(
                "UNAUTHENTICATED", "this node needs a bearer token: send the header 'authorization: Bearer <token>' "
                "(ADBC: db_kwargs={'adbc.flight.sql.authorization_header': 'Bearer <token>'}); `federator users add` "
                "makes one"))
        return _BearerToken(token)


def peer_address(peer: str) -> str:
    """The address of a gRPC peer (``ipv4:1.2.3.4:5678``, ``ipv6:[::1]:5678``), without its port."""
    address = peer.partition(":")[2] or peer
    return address.rpartition(":")[0].strip("[]") or address


def _python_value(v: Any) -> Any:
    """A bound Arrow parameter as the engine takes parameters (strings, numbers, booleans, null)."""
    if isinstance(v, (dt.datetime, dt.date, dt.time)):
        return v.isoformat()
    if isinstance(v, decimal.Decimal):
        return int(v) if v == v.to_integral_value() else float(v)
    return v


def parameter_rows(table: pa.Table) -> list[list[Any]]:
    """One list of positional values per row of a bound parameter batch."""
    columns = [[_python_value(v) for v in col.to_pylist()] for col in table.columns]
    return [list(row) for row in zip(*columns)] if columns else [[] for _ in range(table.num_rows)]


def _chunked(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        if batch.num_rows <= MAX_BATCH_ROWS:
            yield batch
        else:
            for start in range(0, batch.num_rows, MAX_BATCH_ROWS):
                yield batch.slice(start, MAX_BATCH_ROWS)


class FlightSqlServer(flight.FlightServerBase):
    def __init__(self, node: Any, location: str, *, max_statements: int = 10_000, statement_ttl: float = 3600.0,
                 max_results: int = 1_000, result_ttl: float = 300.0, users: Users | None = None,
                 tls_certificates: list[tuple[bytes, bytes]] | None = None) -> None:
        middleware: dict[str, flight.ServerMiddlewareFactory] = {_MIDDLEWARE: _CallOptionsFactory()}
        if users is not None:
            middleware[_AUTH] = _BearerAuthFactory()
        self.users = users
        super().__init__(location, middleware=middleware, tls_certificates=tls_certificates or [])
        self.node = node
        self.statements: Expiring[PreparedStatement] = Expiring(max_statements, statement_ttl)
        self.results: Expiring[PendingResult] = Expiring(max_results, result_ttl)

    def _authenticate(self, context: flight.ServerCallContext) -> None:
        bearer_token = context.get_middleware(_AUTH)
        if self.users is None or bearer_token is None:
            return
        refused = self.users.login(bearer_token.token, peer_address(context.peer())).error()
        if refused is not None:
            raise flight_error(refused)

    # ---- running SQL ------------------------------------------------------------------------
    def _options(self, context: flight.ServerCallContext) -> CallOptions:
        opts = context.get_middleware(_MIDDLEWARE)
        return opts if opts is not None else CallOptions({})

    def _execute(self, context: flight.ServerCallContext, sql: str, rows: list[list[Any]] | None) -> PendingResult:
        """Run ``sql`` once per parameter row (once without parameters); results are concatenated."""
        opts = self._options(context)
        limits = limits_of(self.node)
        limits.check_sql(sql)
        # Each run holds one of the node's query slots (shared with HTTP) while it runs here; the
        # batches DoGet streams later are already admitted.
        if not rows or len(rows) == 1:
            req = opts.request(sql, rows[0] if rows else [], limits=limits)
            with admitted(self.node, req):
                result = self.node.sql(req)
                capped = limits.capped(iter(result.batches))
                try:
                    # Read the start now: most failures (and an answer over a cap) surface here,
                    # while the call can still fail cleanly.
                    capped.read_ahead()
                except BaseException:
                    capped.close()
                    raise
            batches: Iterator[pa.RecordBatch] = _chunked(capped)
            schema, token = result.schema, result.consistency_token
        else:
            tables, token, rows_in, bytes_in = [], None, 0, 0
            for row in rows:
                # Each execution is bounded by the previous one's token: later rows never read older data.
                req = opts.request(sql, row, token, limits=limits)
                with admitted(self.node, req):
                    result = self.node.sql(req)
                    table = pa.Table.from_batches(list(result.batches), schema=result.schema)
                rows_in, bytes_in = rows_in + table.num_rows, bytes_in + table.nbytes
                limits.check_rows(rows_in, bytes_in)
                tables.append(table)
                token = result.consistency_token
            table = pa.concat_tables(tables, promote_options="permissive")
            schema, batches = table.schema, _chunked(iter(table.to_batches()))
        opts.response_token = token
        return PendingResult(schema, batches, token)

    def _statement(self, handle: bytes) -> PreparedStatement:
        stmt = self.statements.get(handle)
        if stmt is None:
            raise SqlError("INVALID_PARAMETER", "unknown or expired prepared statement handle; prepare the statement again")
        return stmt

    def _prepared_rows(self, stmt: PreparedStatement) -> list[list[Any]] | None:
        with stmt.lock:
            rows = stmt.parameter_rows
        if stmt.param_count and not rows:
            raise SqlError("INVALID_PARAMETER",
                           f"the SQL has {stmt.param_count} ? placeholder(s) but no parameters were bound")
        return rows

    def _run_command(self, context: flight.ServerCallContext, name: str, cmd: Any) -> PendingResult | pa.Table:
        """A statement's pending result, or a catalog command's table."""
        if name == "CommandStatementQuery":
            if cmd.HasField("transaction_id"):
                raise _unsupported("a transaction", "Federator reads live state; send the query on its own")
            return self._execute(context, cmd.query, None)
        if name == "CommandPreparedStatementQuery":
            stmt = self._statement(cmd.prepared_statement_handle)
            return self._execute(context, stmt.sql, self._prepared_rows(stmt))
        table = self._catalog(name, cmd)
        if table is None:
            raise _unsupported(f"the Flight SQL command {name}")
        return table

    def _catalog(self, name: str, cmd: Any) -> pa.Table | None:
        def opt(field: str) -> str | None:
            return getattr(cmd, field) if cmd.HasField(field) else None

        if name == "CommandGetCatalogs":
            return metadata.catalogs()
        if name == "CommandGetDbSchemas":
            return metadata.db_schemas(opt("catalog"), opt("db_schema_filter_pattern"))
        if name == "CommandGetTables":
            return metadata.tables(self.node.stores, opt("catalog"), opt("db_schema_filter_pattern"),
                                   opt("table_name_filter_pattern"), list(cmd.table_types), cmd.include_schema)
        if name == "CommandGetTableTypes":
            return metadata.table_types()
        if name == "CommandGetSqlInfo":
            return metadata.sql_info(list(cmd.info))
        if name == "CommandGetPrimaryKeys":
            return metadata.primary_keys(self.node.stores, opt("catalog"), opt("db_schema"), cmd.table)
        return None

    @staticmethod
    def _command(descriptor: flight.FlightDescriptor) -> tuple[str, Any]:
        if descriptor.descriptor_type != flight.DescriptorType.CMD:
            raise SqlError("INVALID_PARAMETER", "path descriptors are not served; send a Flight SQL command")
        name, cmd = protocol.unpack(descriptor.command)
        if cmd is None:
            raise _unsupported(f"the Flight SQL command {name}")
        return name, cmd

    # ---- Flight RPCs ------------------------------------------------------------------------
    @_rpc
    def get_flight_info(self, context: flight.ServerCallContext, descriptor: flight.FlightDescriptor) -> flight.FlightInfo:
        name, cmd = self._command(descriptor)
        out = self._run_command(context, name, cmd)
        if isinstance(out, pa.Table):
            # The ticket is the command itself: DoGet answers it again, nothing is kept.
            return flight.FlightInfo(out.schema, descriptor, [flight.FlightEndpoint(descriptor.command, [])],
                                     out.num_rows, -1)
        handle = self.results.add(out)
        ticket = protocol.pack(protocol.TicketStatementQuery(statement_handle=handle))
        return flight.FlightInfo(out.schema, descriptor, [flight.FlightEndpoint(ticket, [])], -1, -1)

    @_rpc
    def get_schema(self, context: flight.ServerCallContext, descriptor: flight.FlightDescriptor) -> flight.SchemaResult:
        name, cmd = self._command(descriptor)
        if name == "CommandGetTables":
            return flight.SchemaResult(
                metadata.TABLES_WITH_SCHEMA_SCHEMA if cmd.include_schema else metadata.TABLES_SCHEMA)
        # A statement's schema is known once it has run (the engine plans against live definitions).
        out = self._run_command(context, name, cmd)
        if isinstance(out, PendingResult):
            _close(out.batches)
        return flight.SchemaResult(out.schema)

    @_rpc
    def do_get(self, context: flight.ServerCallContext, ticket: flight.Ticket) -> flight.FlightDataStream:
        name, msg = protocol.unpack(ticket.ticket)
        if msg is None:
            raise SqlError("INVALID_PARAMETER", f"not a Federator Flight SQL ticket ({name or 'unreadable'})")
        if name == "TicketStatementQuery":
            pending = self.results.pop(msg.statement_handle)
            if pending is None:
                raise SqlError("INVALID_PARAMETER",
                               "unknown, expired or already used statement ticket; call GetFlightInfo again")
            return flight.GeneratorStream(pending.schema, _streamed(pending.batches))
        table = self._catalog(name, msg)
        if table is None:
            raise _unsupported(f"a ticket holding {name}")
        return flight.RecordBatchStream(table)

    @_rpc
    def do_put(self, context: flight.ServerCallContext, descriptor: flight.FlightDescriptor,
               reader: flight.MetadataRecordBatchReader, writer: flight.FlightMetadataWriter) -> None:
        name, cmd = self._command(descriptor)
        if name == "CommandPreparedStatementQuery":
            stmt = self._statement(cmd.prepared_statement_handle)
            rows = parameter_rows(reader.read_all())
            for i, row in enumerate(rows):
                if len(row) != stmt.param_count:
                    raise SqlError("INVALID_PARAMETER",
                                   f"the SQL has {stmt.param_count} ? placeholder(s) but parameter row {i + 1} "
                                   f"has {len(row)} value(s)")
            with stmt.lock:
                stmt.parameter_rows = rows
            result = protocol.DoPutPreparedStatementResult(prepared_statement_handle=cmd.prepared_statement_handle)
            writer.write(pa.py_buffer(result.SerializeToString()))
            return
        if name == "CommandStatementUpdate":
            from federator.sql.parse import parse

            parse(cmd.query)  # a write is refused here with the engine's own message
            raise _unsupported("a query sent as an update (DoPut)", "send SELECT through GetFlightInfo")
        raise SqlError("UNSUPPORTED", f"{name} is not a read: Federator only reads; the pipeline writes the stores")

    @_rpc
    def do_action(self, context: flight.ServerCallContext, action: flight.Action) -> list[flight.Result]:
        body = action.body.to_pybytes() if action.body is not None else b""
        if action.type == protocol.CREATE_PREPARED_STATEMENT:
            name, req = protocol.unpack(body)
            if name != "ActionCreatePreparedStatementRequest" or req is None:
                raise SqlError("INVALID_PARAMETER", f"{action.type} takes an ActionCreatePreparedStatementRequest, not {name}")
            if req.HasField("transaction_id"):
                raise _unsupported("a transaction", "Federator reads live state; prepare the query on its own")
            from federator.sql.parse import parse

            stmt = parse(req.query)  # parsed once per SQL text (cached); bad SQL fails the prepare
            handle = self.statements.add(PreparedStatement(req.query, stmt.param_count))
            # The result and parameter schemas are left empty (unknown): the engine learns the
            # result schema by planning against live definitions, and does not type parameters.
            result = protocol.ActionCreatePreparedStatementResult(prepared_statement_handle=handle)
            return [flight.Result(protocol.pack(result))]
        if action.type == protocol.CLOSE_PREPARED_STATEMENT:
            name, req = protocol.unpack(body)
            if name != "ActionClosePreparedStatementRequest" or req is None:
                raise SqlError("INVALID_PARAMETER", f"{action.type} takes an ActionClosePreparedStatementRequest, not {name}")
            self.statements.pop(req.prepared_statement_handle)
            return []
        raise _unsupported(f"the Flight action {action.type!r}",
                           f"actions are {protocol.CREATE_PREPARED_STATEMENT} and {protocol.CLOSE_PREPARED_STATEMENT}")

    def list_actions(self, context: flight.ServerCallContext) -> list[tuple[str, str]]:
        return [(protocol.CREATE_PREPARED_STATEMENT, "Prepare a SQL statement (parsed once, ? parameters)"),
                (protocol.CLOSE_PREPARED_STATEMENT, "Release a prepared statement")]


def _close(batches: Iterator[pa.RecordBatch]) -> None:
    close = getattr(batches, "close", None)
    if close is not None:
        close()


def _streamed(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The batches, with a failure while streaming mapped like any other error."""
    take = _translated(_take_one)
    try:
        while True:
            chunk = take(batches)
            if not chunk:
                return
            yield chunk[0]
    finally:
        _close(batches)


def _take_one(batches: Iterator[pa.RecordBatch]) -> list[pa.RecordBatch]:
    nxt = next(batches, None)
    return [] if nxt is None else [nxt]


def start(node: Any, host: str, port: int, users: Users | None = None, tls: Tls | None = None) -> FlightSqlServer:
    """Serve Flight SQL for ``node`` on host:port (serving starts at once, in gRPC's threads);
    with ``users``, each call needs one of their bearer tokens; with ``tls``, over TLS."""
    if tls is None:
        return FlightSqlServer(node, f"grpc://{host}:{port}", users=users)
    return FlightSqlServer(node, f"grpc+tls://{host}:{port}", users=users,
                           tls_certificates=[(tls.cert.read_bytes(), tls.key.read_bytes())])


def stop(server: FlightSqlServer, timeout: float = 5.0) -> None:
    """Stop serving; calls still streaming after ``timeout`` seconds are abandoned with the process."""
    t = threading.Thread(target=server.shutdown, name="flight-shutdown", daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        log.warning("Flight SQL calls still streaming after %.0f s of shutdown; the process ends with them", timeout)
