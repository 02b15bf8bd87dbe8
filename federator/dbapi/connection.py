"""A DB-API connection: a list of nodes, an HTTP pool, and the session's consistency token.

Every node answers SQL for the whole cluster, so the connection sends each statement to
one node: the last that answered, else the next in the list. A node that does not answer
(refused, unreachable, timed out, connection dropped) is skipped; reads are idempotent,
so sending the statement again elsewhere is safe. A node that answers with an error is
not skipped: the error is the cluster's answer, not that node's.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any, Sequence
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.ipc as pa_ipc
import urllib3

from federator.dbapi.cursor import Cursor
from federator.dbapi.errors import InterfaceError, NotSupportedError, OperationalError, error_from_answer
from federator.query.position import Position

# The header the service puts the answer's token in for non-JSON formats
# (federator.http.sql_routes.TOKEN_HEADER; not imported so the driver does not load Flask).
TOKEN_HEADER = "X-Federator-Consistency-Token"
AUTH_TOKEN_ENV = "FEDERATOR_AUTH_TOKEN"  # the bearer token when connect() is given none
DEFAULT_PORTS = {"http": 8080, "https": 443}
_CONNECT_TIMEOUT_S = 5.0  # a node that cannot even accept a connection in 5 s is skipped
# nor less than this, however short the statement's timeout: a 1 ms timeout is the server's to
# enforce (its 504 TIMEOUT), not a 1 ms connect that fails as "no node answered"
_MIN_CONNECT_TIMEOUT_S = 0.5
_READ_SLACK_S = 5.0  # wait up to this much past the server's own deadline, so its 504 arrives first


def parse_nodes(url: str) -> list[str]:
    """``http://h1:p1,h2:p2[/prefix]`` -> ``["http://h1:p1/prefix", "http://h2:p2/prefix"]``.

    A part may carry its own scheme (``http://a:1,https://b:2``); one without takes the
    first part's. A missing port is the scheme's default (8080 for http, as the examples of
    `federator node` use; 443 for https). A path given on the last part applies to all.
    """
    if not isinstance(url, str) or "://" not in url:
        raise InterfaceError(f"connect() needs a URL like 'http://host:port[,host2:port2]', got {url!r}")
    scheme = url.split("://", 1)[0].lower()
    parsed = []
    for part in (p.strip() for p in url.split(",")):
        if not part:
            continue
        if "://" not in part:
            part = f"{scheme}://{part}"
        try:
            u = urlsplit(part)
            s = u.scheme.lower()
            if s not in DEFAULT_PORTS:
                raise ValueError(f"unsupported scheme {s!r}; use http or https")
            port = u.port or DEFAULT_PORTS[s]
            if not u.hostname:
                raise ValueError("no host")
        except ValueError as e:
            raise InterfaceError(f"bad node address {part!r} in {url!r}: {e}") from None
        host = f"[{u.hostname}]" if ":" in u.hostname else u.hostname
        parsed.append((f"{s}://{host}:{port}", u.path.rstrip("/")))
    if not parsed:
        raise InterfaceError(f"no node address in {url!r}")
    prefix = parsed[-1][1]
    return [base + (path or prefix) for base, path in parsed]


class Connection:
    def __init__(self, url: str, *, timeout: float = 10.0, allow_stale: bool = False, max_lag: int | None = None,
                 token: str | None = None, verify: bool | str = True, auth_token: str | None = None) -> None:
        if not (isinstance(timeout, (int, float)) and timeout > 0):
            raise InterfaceError(f"timeout must be a positive number of seconds, got {timeout!r}")
        self.nodes = parse_nodes(url)
        self.timeout = float(timeout)
        self.allow_stale = bool(allow_stale)
        self.max_lag = max_lag
        self._token = token or None
        auth = auth_token if auth_token is not None else os.environ.get(AUTH_TOKEN_ENV)
        self._headers = {"Content-Type": "application/json", "Accept": "application/vnd.apache.arrow.stream"}
        if auth:  # a node with --users-file answers 401 UNAUTHENTICATED without it
            self._headers["Authorization"] = f"Bearer {auth}"
        self._preferred = 0
        self._lock = threading.Lock()
        tls: dict[str, Any] = {}
        if verify is False:
            tls = {"cert_reqs": "CERT_NONE"}
        elif isinstance(verify, str):
            tls = {"ca_certs": verify}
        # retries=False: failover is ours (next node), not urllib3's (same node again).
        self._http: urllib3.PoolManager | None = urllib3.PoolManager(retries=False, **tls)

    # ---- PEP 249 --------------------------------------------------------------------------

    def cursor(self) -> Cursor:
        self._check_open()
        return Cursor(self)

    def commit(self) -> None:
        """Nothing to commit: the service only reads."""
        self._check_open()

    def rollback(self) -> None:
        self._check_open()
        raise NotSupportedError("Federator is read-only and has no transactions to roll back")

    def close(self) -> None:
        if self._http is not None:
            self._http.clear()
            self._http = None

    @property
    def closed(self) -> bool:
        return self._http is None

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- extensions ---------------------------------------------------------------------

    def execute(self, sql: str, parameters: Sequence[Any] | None = None) -> Cursor:
        """A new cursor that has run ``sql`` (as sqlite3's shortcut)."""
        return self.cursor().execute(sql, parameters)

    @property
    def consistency_token(self) -> str | None:
        """The freshest position this session has read; sent with every statement, so reads
        never go back in time. Hand it to another session (``token=``) to share that floor."""
        return self._token

    @consistency_token.setter
    def consistency_token(self, token: str | None) -> None:
        with self._lock:
            self._token = token or None

    def _advance(self, token: str | None) -> None:
        # The service's answer token already includes the bound we sent; merging anyway keeps
        # the floor monotonic when cursors of one connection answer out of order (threads).
        if not token:
            return
        with self._lock:
            if self._token is None:
                self._token = token
                return
            try:
                self._token = Position.from_token(self._token).merge(Position.from_token(token)).to_token()
            except ValueError:
                self._token = token

    def _check_open(self) -> urllib3.PoolManager:
        if self._http is None:
            raise InterfaceError("the connection is closed")
        return self._http

    def run(self, sql: str, parameters: list[Any]) -> tuple[pa.Table, str | None]:
        """Run one statement; its whole answer as an Arrow table, and the answer's token."""
        if not isinstance(sql, str):
            raise InterfaceError(f"the statement must be a str, got {type(sql).__name__}")
        body: dict[str, Any] = {"sql": sql, "parameters": parameters, "consistency_token": self._token,
                                "allow_stale": self.allow_stale, "timeout_ms": max(1, int(self.timeout * 1000)),
                                "format": "arrow"}
        if self.max_lag is not None:
            body["max_lag"] = self.max_lag
        resp, url = self._post(json.dumps(body).encode())
        if resp.status != 200:
            try:
                doc = json.loads(resp.data)
            except ValueError:
                doc = resp.data[:300].decode("utf-8", "replace")
            raise error_from_answer(resp.status, doc, resp.headers.get("Retry-After"))
        try:
            table = pa_ipc.open_stream(resp.data).read_all()
        except (pa.ArrowInvalid, OSError) as e:
            raise OperationalError(f"the answer from {url} is not a complete Arrow stream: {e}") from None
        token = resp.headers.get(TOKEN_HEADER)
        self._advance(token)
        return table, token

    def _post(self, body: bytes) -> tuple[urllib3.BaseHTTPResponse, str]:
        http = self._check_open()
        timeout = urllib3.Timeout(connect=min(_CONNECT_TIMEOUT_S, max(_MIN_CONNECT_TIMEOUT_S, self.timeout)), read=self.timeout + min(_READ_SLACK_S, max(0.5, self.timeout)))
        first = self._preferred
        failures = []
        for i in range(len(self.nodes)):
            idx = (first + i) % len(self.nodes)
            url = self.nodes[idx] + "/v1/sql"
            try:
                # The whole body is read here (preload), so a connection cut mid-answer also
                # counts as "did not answer" and the next node is tried.
                resp = http.request("POST", url, body=body, timeout=timeout, headers=self._headers)
            except urllib3.exceptions.LocationValueError as e:
                raise InterfaceError(f"bad node address {self.nodes[idx]!r}: {e}") from None
            except urllib3.exceptions.HTTPError as e:
                failures.append(f"{self.nodes[idx]}: {_reason(e)}")
                continue
            self._preferred = idx
            return resp, url
        raise OperationalError("no Federator node answered: " + "; ".join(failures))


def _reason(e: BaseException) -> str:
    # urllib3 wraps the OS error; the innermost one says what happened ("Connection refused").
    inner: BaseException = e
    while inner.__context__ is not None and isinstance(inner.__context__, OSError):
        inner = inner.__context__
    return f"{type(e).__name__}: {inner}" if inner is not e else f"{type(e).__name__}: {e}"
