"""The Postgres wire protocol (v3) on a node: psql, JDBC, psycopg, asyncpg and the BI tools on them.

pygwire decodes what clients send and encodes our answers (a sans-I/O codec: the sockets, TLS,
authentication and the statements are ours). Each connection has a thread of its own, like a
Postgres backend; its statements go through ``Session`` (federator.pgwire.session), which runs
queries on the node's SQL engine with the node's limits and query slots, shared with HTTP and
Flight SQL.

- TLS: an SSLRequest is accepted when the node has --tls-cert/--tls-key, and then required.
- Authentication: SCRAM-SHA-256 against the node's users file (the token is the password);
  without one, anyone who reaches the port (a loopback --listen unless --allow-anonymous).
- Errors: each Federator code's SQLSTATE (federator.errors.CODES), the code itself in the detail;
  a refused startup or login too (FATAL).
- Cancel requests stop the statement's answer at its next batch.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import re
import secrets
import socket
import threading
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pygwire.codec import FrontendMessageDecoder
from pygwire.exceptions import PygwireError
from pygwire.constants import ConnectionPhase, TransactionStatus
from pygwire import messages as m

from federator.auth import Login, Users, Verifier
from federator.errors import FederatorError, SqlError, as_error
from federator.pgwire import types as pgt
from federator.pgwire.catalog import PgCatalog
from federator.pgwire.session import REPORTED, Answer, Session, count_rows, display_name
from federator.tls import Tls

log = logging.getLogger(__name__)

_SEND_AT = 256 * 1024  # bytes of rows gathered before a write to the socket
_MAX_MESSAGE = 64 * 1024 * 1024  # a client message longer than this closes the connection


class _Closed(Exception):
    """The client went away."""


def error_of(e: BaseException, severity: str = "ERROR") -> m.ErrorResponse:
    """``e`` as an ErrorResponse: its code's SQLSTATE, and the code in the detail."""
    err = as_error(e)
    detail = f"Federator error code {err.code}"
    if err.fields.get("partitions"):
        detail += f"; partitions: {err.fields['partitions']}"
    return m.ErrorResponse(fields={"S": severity, "V": severity, "C": err.row.sqlstate, "M": err.message, "D": detail})


@dataclass
class _Statement:
    sql: str
    param_types: list[int]
    described: tuple[list[int], pa.Schema | None] | None = None


@dataclass
class _Portal:
    statement: _Statement
    parameters: list[Any]
    result_formats: list[int]
    answer: Answer | None = None
    oids: list[int] = field(default_factory=list)
    sent: int = 0  # rows sent by earlier Executes
    pending: pa.RecordBatch | None = None  # rows an Execute's row limit left for the next
    done: bool = False  # every row is sent


class PgServer:
    """Serves ``service`` (the node's SqlService) on host:port (0: any free port)."""

    def __init__(self, service: Any, host: str, port: int, users: Users | None = None, tls: Tls | None = None) -> None:
        self.service, self.users, self.tls = service, users, tls
        self.catalog = PgCatalog(lambda: service.stores)
        self._listener = socket.create_server((host, port))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._sessions: dict[int, tuple[bytes, Session]] = {}  # pid -> (secret, session), for cancel requests
        self._sockets: set[socket.socket] = set()
        self._closed = False

    def start(self) -> None:
        threading.Thread(target=self._accept, name="pg-server", daemon=True).start()

    def stop(self) -> None:
        with self._lock:
            self._closed = True
            sockets, self._sockets = list(self._sockets), set()
        _close(self._listener)
        for s in sockets:
            _close(s)

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                if self._closed:
                    _close(sock)
                    return
                self._sockets.add(sock)
            threading.Thread(target=self._serve, args=(sock,), name="pg-conn", daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        conn = _Connection(self, sock)
        try:
            conn.run()
        except (_Closed, ConnectionError, OSError):
            pass
        except Exception:  # noqa: BLE001 - one connection's bug must not reach the others
            log.exception("Postgres connection failed")
        finally:
            with self._lock:
                self._sockets.discard(sock)
                self._sockets.discard(conn.sock)
                if conn.session is not None:
                    self._sessions.pop(conn.session.pid, None)
            _close(conn.sock)

    def register(self, session: Session) -> bytes:
        secret = secrets.token_bytes(4)
        with self._lock:
            self._sessions[session.pid] = (secret, session)
        return secret

    def cancel(self, pid: int, secret: bytes) -> None:
        with self._lock:
            entry = self._sessions.get(pid)
        if entry is not None and hmac.compare_digest(entry[0], secret):
            entry[1].cancel()


_NO_KEY = bytes(32)  # an unknown user's keys: no proof hashes to them


def _peer(sock: socket.socket) -> str:
    try:
        return str(sock.getpeername()[0])
    except OSError:
        return "unknown"


class _Connection:
    def __init__(self, server: PgServer, sock: socket.socket) -> None:
        self.server, self.sock = server, sock
        self.decoder = FrontendMessageDecoder()
        self.out = bytearray()
        self.session: Session | None = None
        self.statements: dict[str, _Statement] = {}
        self.portals: dict[str, _Portal] = {}

    # ---- bytes ---------------------------------------------------------------------------
    def send(self, msg: m.PGMessage) -> None:
        self.out += msg.to_wire()
        if len(self.out) >= _SEND_AT:
            self.flush()

    def flush(self) -> None:
        if self.out:
            self.sock.sendall(self.out)
            self.out.clear()

    def receive(self) -> m.PGMessage:
        while True:
            try:
                msg = next(self.decoder, None)
            except PygwireError as e:
                self._refuse(SqlError("BAD_REQUEST", f"cannot read the client's message ({e}); this node speaks "
                                                     "the Postgres protocol version 3"))
                raise _Closed() from None
            if msg is not None:
                return msg
            data = self.sock.recv(65536)
            if not data:
                raise _Closed()
            self.decoder.feed(data)
            if self.decoder.buffered > _MAX_MESSAGE:
                raise _Closed()

    # ---- start -----------------------------------------------------------------------------
    def run(self) -> None:
        startup = self._startup()
        if startup is None:
            return
        params = dict(startup.params)
        user = params.get("user", "")
        if not self._authenticate(user):
            return
        from federator.pgwire.session import next_pid

        try:  # startup parameters are settings (psql's PGOPTIONS: -c name=value)
            self.session = Session(self.server.service, self.server.catalog, user or "federator", next_pid(), params)
        except SqlError as e:
            self._refuse(e)
            return
        self.send(m.AuthenticationOk())
        for name in REPORTED:
            self.send(m.ParameterStatus(name=display_name(name), value=self.session.settings[name]))
        secret = self.server.register(self.session)
        self.send(m.BackendKeyData(process_id=self.session.pid, secret_key=secret))
        self.decoder.phase = ConnectionPhase.READY
        self._ready()
        self._loop()

    def _startup(self) -> m.StartupMessage | None:
        tls_done = False
        while True:
            msg = self.receive()
            if isinstance(msg, m.SSLRequest):
                if self.server.tls is None or tls_done:
                    self.sock.sendall(b"N")
                    continue
                self.sock.sendall(b"S")
                self.sock = self.server.tls.server.wrap_socket(self.sock, server_side=True)
                self.decoder = FrontendMessageDecoder()
                tls_done = True
                continue
            if isinstance(msg, m.GSSEncRequest):
                self.sock.sendall(b"N")
                continue
            if isinstance(msg, m.CancelRequest):
                pid = msg.process_id
                self.server.cancel(pid, bytes(msg.secret_key))
                return None
            if isinstance(msg, m.StartupMessage):
                if self.server.tls is not None and not tls_done:
                    self._refuse(SqlError("FORBIDDEN", "this node takes Postgres connections over TLS only: connect "
                                                       "with sslmode=require (or verify-full with the node's CA)"))
                    return None
                if (msg.protocol_version >> 16) != 3:
                    self._refuse(SqlError("UNSUPPORTED", "only protocol version 3 is served"))
                    return None
                if msg.protocol_version & 0xFFFF:  # 3.2: we speak 3.0, which every 3.x client also speaks
                    self.send(m.NegotiateProtocolVersion(newest_minor=0, unrecognized=[]))
                return msg
            self._refuse(SqlError("BAD_REQUEST", f"expected a startup message, got {type(msg).__name__}"))
            return None

    def _refuse(self, err: FederatorError) -> None:
        self.send(error_of(err, severity="FATAL"))
        self.flush()

    def _authenticate(self, user: str) -> bool:
        users = self.server.users
        if users is None:
            return True
        peer = _peer(self.sock)
        wait = users.failures.wait(peer)
        shut_out = Login(None, wait).error() if wait else None  # TOO_MANY_FAILED_LOGINS
        if shut_out is not None:
            self._refuse(shut_out)
            return False
        # an unknown user goes through the same exchange and checks with a made-up verifier:
        # neither the answer nor its time says which was wrong
        verifier = users.verifiers.get(user) or Verifier(4096, hashlib.sha256(b"federator" + user.encode()).digest()[:16],
                                                         _NO_KEY, _NO_KEY)
        self.send(m.AuthenticationSASL(mechanisms=["SCRAM-SHA-256"]))
        self.flush()
        self.decoder.phase = ConnectionPhase.AUTHENTICATING_SASL_INITIAL
        first = self.receive()
        if not isinstance(first, m.SASLInitialResponse) or first.mechanism != "SCRAM-SHA-256":
            self._refuse(SqlError("FORBIDDEN", "authenticate with SCRAM-SHA-256 (the token `federator users add` printed "
                                               "is the password)"))
            return False
        client_first = bytes(first.data).decode("utf-8", "replace")
        match = re.match(r"^[nyp][^,]*,[^,]*,(?P<bare>(?:m=[^,]*,)?n=[^,]*,r=(?P<nonce>[^,]+).*)$", client_first)
        if match is None:
            self._refuse(SqlError("BAD_REQUEST", "malformed SCRAM client-first message"))
            return False
        nonce = match.group("nonce") + base64.b64encode(secrets.token_bytes(18)).decode()
        server_first = f"r={nonce},s={base64.b64encode(verifier.salt).decode()},i={verifier.iterations}"
        self.send(m.AuthenticationSASLContinue(data=server_first.encode()))
        self.flush()
        self.decoder.phase = ConnectionPhase.AUTHENTICATING_SASL_CONTINUE
        final = self.receive()
        client_final = bytes(getattr(final, "data", b"")).decode("utf-8", "replace")
        fm = re.match(r"^(?P<without>c=[^,]*,r=(?P<nonce>[^,]*)(?:,.*?)?),p=(?P<proof>[A-Za-z0-9+/=]+)$", client_final)
        auth_message = f"{match.group('bare')},{server_first},{fm.group('without') if fm else ''}".encode()
        signature = hmac.digest(verifier.stored_key, auth_message, "sha256")
        proof = base64.b64decode(fm.group("proof")) if fm else b""
        client_key = bytes(a ^ b for a, b in zip(proof, signature))
        ok = hmac.compare_digest(hashlib.sha256(client_key).digest(), verifier.stored_key)
        if not (ok and fm is not None and fm.group("nonce") == nonce and len(proof) == 32 and user in users.verifiers):
            users.failures.failed(peer, f"a Postgres password that is not user {user!r}'s")
            self._refuse(SqlError("UNAUTHENTICATED", f"password authentication failed for user {user!r}: the password "
                                                     "is the token `federator users add` printed for this user"))
            return False
        users.failures.succeeded(peer)
        server_signature = hmac.digest(verifier.server_key, auth_message, "sha256")
        self.send(m.AuthenticationSASLFinal(data=b"v=" + base64.b64encode(server_signature)))
        return True

    # ---- queries ---------------------------------------------------------------------------
    def _ready(self) -> None:
        assert self.session is not None
        self.send(m.ReadyForQuery(status=TransactionStatus(self.session.status)))
        self.flush()

    def _loop(self) -> None:
        assert self.session is not None
        skipping = False  # after an error in the extended protocol, until Sync
        while True:
            msg = self.receive()
            if isinstance(msg, m.Terminate):
                return
            if isinstance(msg, m.Query):
                self._simple(msg.query_string)
                self._ready()
                continue
            if isinstance(msg, m.Sync):
                skipping = False
                self._ready()
                continue
            if isinstance(msg, m.Flush):
                self.flush()
                continue
            if skipping:
                continue
            try:
                self._extended(msg)
            except SqlError as e:
                self.session.fail()
                self.send(error_of(e))
                skipping = True
            except (_Closed, OSError):
                raise
            except Exception as e:  # noqa: BLE001
                log.exception("Postgres statement failed")
                self.session.fail()
                self.send(error_of(e))
                skipping = True

    def _simple(self, sql: str) -> None:
        assert self.session is not None
        statements = split_statements(sql)
        if not statements:
            self.send(m.EmptyQueryResponse())
            return
        for text in statements:
            try:
                self.session.new_statement()
                answer = self.session.execute(text)
                if answer.tag == "" and not answer.has_rows:
                    self.send(m.EmptyQueryResponse())
                    continue
                if answer.has_rows:
                    assert answer.schema is not None
                    oids = [pgt.oid_of(f.type) for f in answer.schema]
                    self.send(_row_description(answer.schema, oids, [0]))
                    rows = self._send_rows(answer, oids, [0], None, 0)
                    self.send(m.CommandComplete(tag=count_rows(answer.tag, rows)))
                else:
                    self.send(m.CommandComplete(tag=answer.tag))
            except SqlError as e:
                self.session.fail()
                self.send(error_of(e))
                return
            except (_Closed, OSError):
                raise
            except Exception as e:  # noqa: BLE001
                log.exception("Postgres statement failed")
                self.session.fail()
                self.send(error_of(e))
                return

    def _send_rows(self, answer: Answer, oids: list[int], formats: list[int], limit: int | None, skip: int) -> int:
        encoders = pgt.row_encoders(oids, formats)
        sent = 0
        for batch in answer.batches:
            for row in pgt.encode_rows(batch, encoders):
                self.send(m.DataRow(columns=row))
                sent += 1
            if limit is not None and sent >= limit:
                break
        return sent

    # ---- the extended protocol ---------------------------------------------------------------
    def _extended(self, msg: m.PGMessage) -> None:
        assert self.session is not None
        if isinstance(msg, m.Parse):
            self.statements[msg.statement] = _Statement(msg.query, list(msg.param_types or []))
            self.send(m.ParseComplete())
        elif isinstance(msg, m.Bind):
            statement = self.statements.get(msg.statement)
            if statement is None:
                raise SqlError("INVALID_PARAMETER", f"prepared statement {msg.statement!r} does not exist")
            types = statement.param_types
            if any(t == 0 for t in types) or len(types) < len(msg.param_values):
                described = self._described(statement)[0]
                types = [t or (described[i] if i < len(described) else 0) for i, t in
                         enumerate(types + [0] * (len(msg.param_values) - len(types)))]
            formats = msg.param_formats
            values = []
            for i, value in enumerate(msg.param_values):
                fmt = formats[0] if len(formats) == 1 else (formats[i] if i < len(formats) else 0)
                try:
                    values.append(pgt.decode_parameter(None if value is None else bytes(value), types[i], fmt))
                except ValueError as e:
                    raise SqlError("INVALID_PARAMETER", f"parameter ${i + 1}: {e}") from None
            self.portals[msg.portal] = _Portal(statement, values, list(msg.result_formats))
            self.send(m.BindComplete())
        elif isinstance(msg, m.Describe):
            kind = msg.kind if isinstance(msg.kind, str) else bytes(msg.kind).decode()
            if kind == "S":
                statement = self.statements.get(msg.name)
                if statement is None:
                    raise SqlError("INVALID_PARAMETER", f"prepared statement {msg.name!r} does not exist")
                params, schema = self._described(statement)
                types = [t or (params[i] if i < len(params) else pgt.VARCHAR)
                         for i, t in enumerate(statement.param_types + [0] * (len(params) - len(statement.param_types)))]
                self.send(m.ParameterDescription(type_oids=types))
                if schema is None:
                    self.send(m.NoData())
                else:
                    self.send(_row_description(schema, [pgt.oid_of(f.type) for f in schema], [0]))
            elif msg.name not in self.portals and msg.name in self.session.cursors:
                schema = self.session.cursors[msg.name].schema  # a DECLAREd cursor is a portal too
                self.send(_row_description(schema, [pgt.oid_of(f.type) for f in schema], [0]))
            else:
                portal = self._portal(msg.name)
                self._run(portal)
                assert portal.answer is not None
                if not portal.answer.has_rows:
                    self.send(m.NoData())
                else:
                    assert portal.answer.schema is not None
                    self.send(_row_description(portal.answer.schema, portal.oids, portal.result_formats))
        elif isinstance(msg, m.Execute):
            portal = self._portal(msg.portal)
            self._run(portal)
            answer = portal.answer
            assert answer is not None
            if answer.tag == "" and not answer.has_rows:
                self.send(m.EmptyQueryResponse())
            elif not answer.has_rows:
                self.send(m.CommandComplete(tag=answer.tag))
            else:
                limit = msg.max_rows or None
                rows = self._send_limited(portal, limit)
                if limit is not None and rows == limit and not portal.done:
                    self.send(m.PortalSuspended())
                else:
                    self.send(m.CommandComplete(tag=count_rows(answer.tag, portal.sent)))
        elif isinstance(msg, m.Close):
            kind = msg.kind if isinstance(msg.kind, str) else bytes(msg.kind).decode()
            (self.statements if kind == "S" else self.portals).pop(msg.name, None)
            self.send(m.CloseComplete())
        else:
            raise SqlError("UNSUPPORTED", f"{type(msg).__name__} messages are not served (COPY and function "
                                          "calls are not; use queries)")

    def _portal(self, name: str) -> _Portal:
        portal = self.portals.get(name)
        if portal is None:
            raise SqlError("INVALID_PARAMETER", f"portal {name!r} does not exist")
        return portal

    def _described(self, statement: _Statement) -> tuple[list[int], pa.Schema | None]:
        assert self.session is not None
        if statement.described is None:
            statement.described = self.session.describe(statement.sql)
        return statement.described

    def _run(self, portal: _Portal) -> None:
        assert self.session is not None
        if portal.answer is not None:
            return
        self.session.new_statement()
        portal.answer = self.session.execute(portal.statement.sql, portal.parameters)
        if portal.answer.has_rows:
            assert portal.answer.schema is not None
            described = portal.statement.described
            if described is not None and described[1] is not None and len(described[1]) == len(portal.answer.schema):
                portal.oids = [pgt.oid_of(f.type) for f in described[1]]  # as the client was told
            else:
                portal.oids = [pgt.oid_of(f.type) for f in portal.answer.schema]

    def _send_limited(self, portal: _Portal, limit: int | None) -> int:
        """Send up to ``limit`` rows of the portal (all with None); the rows sent."""
        answer = portal.answer
        assert answer is not None
        encoders = pgt.row_encoders(portal.oids, portal.result_formats)
        sent = 0
        while limit is None or sent < limit:
            batch = portal.pending
            portal.pending = None
            if batch is None:
                batch = next(answer.batches, None)
                if batch is None:
                    portal.done = True
                    break
            if limit is not None and batch.num_rows > limit - sent:
                take = limit - sent
                portal.pending = batch.slice(take)
                batch = batch.slice(0, take)
            for row in pgt.encode_rows(batch, encoders):
                self.send(m.DataRow(columns=row))
            sent += batch.num_rows
        if limit is not None and sent == limit and portal.pending is None and not portal.done:
            nxt = next(answer.batches, None)  # is there more? keep it for the next Execute
            if nxt is None:
                portal.done = True
            else:
                portal.pending = nxt
        portal.sent += sent
        return sent


def _row_description(schema: pa.Schema, oids: list[int], formats: list[int]) -> m.RowDescription:
    fields = []
    for i, (f, oid) in enumerate(zip(schema, oids)):
        fmt = formats[0] if len(formats) == 1 else (formats[i] if i < len(formats) else 0)
        fields.append(m.FieldDescription(name=f.name, table_oid=0, column_attr=0, type_oid=oid,
                                         type_size=pgt.by_oid(oid).size, type_modifier=-1, format_code=fmt))
    return m.RowDescription(fields=fields)


def split_statements(sql: str) -> list[str]:
    """The statements of a simple query, split on the semicolons outside strings, identifiers and comments."""
    out, start, i, n = [], 0, 0, len(sql)
    while i < n:
        c = sql[i]
        if c in ("'", '"'):
            j = i + 1
            while j < n:
                if sql[j] == c:
                    if j + 1 < n and sql[j + 1] == c:
                        j += 2
                        continue
                    break
                j += 1
            i = j + 1
        elif c == "-" and sql.startswith("--", i):
            nl = sql.find("\n", i)
            i = n if nl < 0 else nl + 1
        elif c == "/" and sql.startswith("/*", i):
            end = sql.find("*/", i + 2)
            i = n if end < 0 else end + 2
        elif c == "$":
            tag = re.match(r"\$(?:[A-Za-z_]\w*)?\$", sql[i:])
            if tag:
                end = sql.find(tag.group(0), i + len(tag.group(0)))
                i = n if end < 0 else end + len(tag.group(0))
            else:
                i += 1
        elif c == ";":
            out.append(sql[start:i])
            start = i = i + 1
        else:
            i += 1
    out.append(sql[start:])
    return [s for s in (s.strip() for s in out) if s and not _only_comments(s)]


def _only_comments(s: str) -> bool:
    return not re.sub(r"--[^\n]*|/\*.*?\*/", "", s, flags=re.S).strip()


def _close(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        s.close()
    except OSError:
        pass


def start(service: Any, host: str, port: int, users: Users | None, tls: Tls | None) -> PgServer:
    server = PgServer(service, host, port, users, tls)
    server.start()
    return server

