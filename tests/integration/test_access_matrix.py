"""Every entry of a node, asked without credentials, with wrong ones and with right ones, on
nodes of every set-up (tests/integration/access_matrix.py holds the expected table, which the
docs' security page shows). Real nodes as subprocesses, real clients: urllib3, the key port's
own framing over a socket, ADBC over Flight SQL, psycopg."""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import adbc_driver_flightsql.dbapi as flightsql
import adbc_driver_manager
import psycopg
import pyarrow as pa
import pytest
import urllib3

from federator.dispatch import NodeClient
from federator.partitioner import partition_for
from federator.query import wire
from federator.query.queries import KeyQuery
from federator.query.request import StateQueryRequest
from federator.tls import Tls
from tests.certificates import make_certificate
from tests.conftest import federator_cmd, free_port
from tests.integration import access_matrix
from tests.integration.changelog_util import produce, register
from tests.integration.cluster import NodeProcess, wait_for

P = 2
KEY, VALUE = "p07", 70
SECRET, WRONG = "s" * 8 + uuid.uuid4().hex, "w" * 8 + uuid.uuid4().hex
WRONG_TOKEN = "not-a-token-of-anyone"


@dataclass
class Node:
    setup: str
    process: NodeProcess
    token: str | None  # a user's token, where the node has users
    cert: Path | None  # the node's certificate, where it speaks TLS
    key_port: int

    @property
    def scheme(self) -> str:
        return "https" if self.cert else "http"

    def context(self) -> ssl.SSLContext | None:
        return ssl.create_default_context(cafile=str(self.cert)) if self.cert else None


@pytest.fixture(scope="module")
def nodes(broker, tmp_path_factory) -> Iterator[dict[str, Node]]:
    root = tmp_path_factory.mktemp("access")
    cert, key = make_certificate(root)
    users = root / "users"
    done = subprocess.run(federator_cmd("users", "add", "alice", "--users-file", str(users)),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    token = done.stdout.strip()
    secret_file = root / "cluster-secret"
    secret_file.write_text(SECRET + "\n")
    out: dict[str, Node] = {}
    for setup, (has_users, has_secret, has_tls) in access_matrix.SETUPS.items():
        app_id = f"ac{uuid.uuid4().hex[:8]}"
        defn = register(broker, app_id, {"name": "scores", "type": "kv", "partitions": P,
                                         "key": {"name": "player", "format": "string"},
                                         "value": {"name": "score", "format": "long"}})
        produce(broker, defn.topic, P, [(KEY.encode(), KEY.encode(), defn.value.serialize(VALUE), 1_700_000_000_000)])
        node = NodeProcess(broker.bootstrap_servers, app_id, "n0", root / f"node-{setup.replace('+', '-')}" / "n0",
                           standby_replicas=0, flight_port=free_port(), pg_port=free_port())
        key_port = free_port()
        node.extra_args = ["--key-port", str(key_port)]
        node.extra_args += ["--users-file", str(users)] if has_users else []
        node.extra_args += ["--cluster-secret-file", str(secret_file)] if has_secret else []
        node.extra_args += ["--tls-cert", str(cert), "--tls-key", str(key)] if has_tls else []
        node.client = NodeClient(node.endpoint, SECRET if has_secret else None, timeout=10,
                                 tls=Tls(cert, key) if has_tls else None)
        out[setup] = Node(setup, node, token if has_users else None, cert if has_tls else None, key_port)
    try:
        for n in out.values():
            n.process.start(wait=False)  # every node starts at once
        for n in out.values():
            wait_for(lambda: n.process.ready(), 60, f"the {n.setup} node to be ready")
        yield out
    finally:
        for n in out.values():
            n.process.stop()


# ---- one way of asking per entry: (node, credential or None) -> an outcome of the table ------------
def _http(method: str, path: str, guard: str, body: dict | None = None) -> Callable[[Node, str | None], str]:
    def ask(node: Node, credential: str | None) -> str:
        headers = {}
        if credential is not None:
            headers = ({"Authorization": f"Bearer {credential}"} if guard == "users"
                       else {wire.SECRET_HEADER: credential})
        if body is not None:
            headers["Content-Type"] = "application/json"
        http = urllib3.PoolManager(retries=False, ssl_context=node.context())
        url = f"{node.scheme}://{node.process.endpoint}{path}"
        resp = http.request(method, url, body=json.dumps(body).encode() if body is not None else None,
                            headers=headers, timeout=20)
        if resp.status != 200:
            # the one body, with the code the status stands for in the table (federator.errors)
            assert json.loads(resp.data)["error"]["code"] == _REFUSED[resp.status], resp.data
            return str(resp.status)
        return "rows" if _holds_row(resp.data) else "ok"
    return ask


_REFUSED = {401: "UNAUTHENTICATED", 403: "FORBIDDEN"}


def _holds_row(data: bytes) -> bool:
    """Whether an answer (JSON or an Arrow stream) holds the store's row (KEY, VALUE)."""
    try:
        return _json_row(json.loads(data))
    except ValueError:
        pass
    try:
        return any((KEY, VALUE) in zip(*(b.column(i).to_pylist() for i in range(2)))
                   for b in pa.ipc.open_stream(data) if b.num_columns >= 2)
    except pa.ArrowInvalid:
        return False


def _json_row(value: object) -> bool:
    if isinstance(value, (list, dict)):
        items = list(value.values() if isinstance(value, dict) else value)
        return (KEY in items and VALUE in items) or any(_json_row(v) for v in items)
    return False


def _key_port(node: Node, hello: bytes, talk: Callable[[Callable[[int], bytes]], str]) -> str:
    """Open the key port (over TLS where the node speaks it), send ``hello``, and let ``talk``
    read the answer once the node welcomed the caller; "refused" when it hung up instead."""
    try:
        with socket.create_connection(("127.0.0.1", node.key_port), timeout=10) as raw:
            sock = node.context().wrap_socket(raw, server_hostname="127.0.0.1") if node.cert else raw
            sock.sendall(hello)
            read = wire.exact_reader(sock.makefile("rb"))
            return talk(read) if read(1) == wire.KEY_WELCOME else "refused"
    except (OSError, EOFError):
        return "refused"


def _key_read(node: Node, credential: str | None) -> str:
    request = wire.key_request("scores", partition_for(KEY.encode(), P), KEY.encode(), None)

    def talk(read: Callable[[int], bytes]) -> str:
        status, _, stored = wire.read_key_answer(read)
        return "rows" if status == wire.KEY_FOUND and VALUE.to_bytes(8, "big") in (stored or b"") else f"status {status}"
    return _key_port(node, wire.key_hello(credential) + request, talk)


def _key_call(node: Node, credential: str | None) -> str:
    request = wire.call_request(json.dumps(_INTERNAL).encode())

    def talk(read: Callable[[int], bytes]) -> str:
        status, payload = wire.read_call_answer(read)
        return "rows" if status == 200 and _holds_row(payload) else f"status {status}"
    return _key_port(node, wire.call_hello(credential) + request, talk)


def _key_watch(node: Node, credential: str | None) -> str:
    return _key_port(node, wire.watch_hello(credential), lambda read: "ok" if read(1) else "refused")


def _flight(node: Node, credential: str | None) -> str:
    scheme = "grpc+tls" if node.cert else "grpc"
    kwargs = {"adbc.flight.sql.authorization_header": f"Bearer {credential}"} if credential else {}
    if node.cert:
        kwargs["adbc.flight.sql.client_option.tls_root_certs"] = node.cert.read_text()
    try:
        with flightsql.connect(f"{scheme}://127.0.0.1:{node.process.flight_port}", db_kwargs=kwargs) as conn, \
                conn.cursor() as cur:
            cur.execute("SELECT player, score FROM scores WHERE player = ?", [KEY])
            return "rows" if cur.fetchall() == [(KEY, VALUE)] else "ok"
    except adbc_driver_manager.Error as e:
        assert "UNAUTHENTICATED: " in str(e), e  # the code first, as in the HTTP body
        return "refused"


def _postgres(node: Node, credential: str | None) -> str:
    dsn = f"host=127.0.0.1 port={node.process.pg_port} dbname=federator user=alice connect_timeout=10"
    dsn += f" sslmode=verify-full sslrootcert={node.cert}" if node.cert else " sslmode=disable"
    try:
        with psycopg.connect(dsn, password=credential or "", autocommit=True) as conn:
            rows = conn.execute("SELECT player, score FROM scores WHERE player = %s", [KEY]).fetchall()
            return "rows" if rows == [(KEY, VALUE)] else "ok"
    except psycopg.OperationalError as e:
        assert "password" in str(e), e
        # the server's refusal (without a password the client stops first) names the code
        assert not credential or "Federator error code UNAUTHENTICATED" in str(e), e
        return "refused"


_SQL = {"sql": "SELECT player, score FROM scores WHERE player = ?", "parameters": [KEY]}
_INTERNAL = StateQueryRequest("scores", KeyQuery(KEY), (partition_for(KEY.encode(), P),)).to_dict()
ASK: dict[str, Callable[[Node, str | None], str]] = {
    "HTTP POST /v1/sql": _http("POST", "/v1/sql", "users", _SQL),
    "HTTP GET /v1/stores/{name}/keys/{key}": _http("GET", f"/v1/stores/scores/keys/{KEY}", "users"),
    "HTTP GET /v1/stores": _http("GET", "/v1/stores", "users"),
    "HTTP GET /v1/stores/{name}": _http("GET", "/v1/stores/scores", "users"),
    "HTTP GET /v1/metadata": _http("GET", "/v1/metadata", "users"),
    "HTTP GET /v1/metadata/stores/{store}/keys/{key}": _http("GET", f"/v1/metadata/stores/scores/keys/{KEY}", "users"),
    "HTTP GET /v1/plugins": _http("GET", "/v1/plugins", "users"),
    "HTTP POST /internal/v1/query": _http("POST", "/internal/v1/query", "secret", _INTERNAL),
    "key port: a key's value": _key_read,
    "key port: a partition query": _key_call,
    "key port: the positions watch": _key_watch,
    "Flight SQL: a statement": _flight,
    "Postgres: a query": _postgres,
    "HTTP GET /": _http("GET", "/", "none"),
    "HTTP GET /console/{name}": _http("GET", "/console/console.js", "none"),
    "HTTP GET /openapi.json": _http("GET", "/openapi.json", "none"),
    "HTTP GET /metrics": _http("GET", "/metrics", "none"),
    "HTTP GET /healthz": _http("GET", "/healthz", "none"),
    "HTTP GET /readyz": _http("GET", "/readyz", "none"),
}
# the credential each entry takes: a user's token (or password), or the cluster secret
_TAKES_SECRET = {"HTTP POST /internal/v1/query", "key port: a key's value", "key port: a partition query",
                 "key port: the positions watch"}


def test_the_table_names_every_entry_a_node_opens(nodes) -> None:
    n = nodes["users"]
    _, api = n.process.client.get_json("/openapi.json")
    opened = {f"HTTP {method.upper()} {path}" for path, ops in api["paths"].items() for method in ops}
    named = {entry for entry, _ in access_matrix.entries()}
    assert opened <= named, f"entries without a row in the access table: {sorted(opened - named)}"
    assert set(ASK) == named


@pytest.mark.parametrize("cell", access_matrix.cells(), ids=lambda c: f"{c.setup}: {c.entry}")
def test_each_cell_of_the_access_table(nodes, cell: access_matrix.Cell) -> None:
    node = nodes[cell.setup]
    right = SECRET if cell.entry in _TAKES_SECRET else node.token
    wrong = WRONG if cell.entry in _TAKES_SECRET else WRONG_TOKEN
    got = tuple(ASK[cell.entry](node, credential) for credential in (None, wrong, right))
    assert got == cell.outcomes


def test_a_plain_text_caller_gets_nothing_from_a_tls_node(nodes) -> None:
    node = nodes["secret+TLS"]
    with pytest.raises(urllib3.exceptions.HTTPError):
        urllib3.PoolManager(retries=False).request("POST", f"http://{node.process.endpoint}/v1/sql", json=_SQL,
                                                   timeout=10)
    plain = Node(node.setup, node.process, None, None, node.key_port)  # the same ports, spoken in clear
    assert _key_read(plain, SECRET) == "refused"
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(f"host=127.0.0.1 port={node.process.pg_port} dbname=federator user=x sslmode=disable "
                        "connect_timeout=10")


def test_the_security_page_shows_the_table() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "reference" / "security.md").read_text()
    assert "<!-- access-matrix -->" in page  # filled in by docs/hooks/security_reference.py
    from docs.hooks.security_reference import on_page_markdown

    assert access_matrix.markdown() in on_page_markdown(page, None, None, None)


@pytest.mark.parametrize("setup", list(access_matrix.REFUSED_STARTS))
def test_a_node_refuses_to_start_without_what_keeps_its_data_in(broker, tmp_path, setup: str) -> None:
    args, words = access_matrix.REFUSED_STARTS[setup]
    users = tmp_path / "users"
    subprocess.run(federator_cmd("users", "add", "alice", "--users-file", str(users)), capture_output=True,
                   timeout=60, check=True)
    short = tmp_path / "short"
    short.write_text("tooshort\n")
    args = [a.format(users=users, port=free_port(), short=short) for a in args]
    done = subprocess.run(federator_cmd("node", "--bootstrap-servers", broker.bootstrap_servers, "--application-id",
                                        f"rf{uuid.uuid4().hex[:8]}", "--state-dir", str(tmp_path / "n0"), *args),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert words in done.stderr and "--cluster-secret-file" in done.stderr, done.stderr[-800:]


def test_repeated_failed_logins_shut_the_peer_out_and_are_logged(nodes) -> None:
    """From a loopback address of its own (127.0.0.2), so no other test's peer is shut out."""
    node = nodes["users"]
    http = urllib3.HTTPConnectionPool("127.0.0.1", node.process.port, retries=False, source_address=("127.0.0.2", 0))

    def ask(token: str) -> urllib3.BaseHTTPResponse:
        return http.request("POST", "/v1/sql", json=_SQL, headers={"Authorization": f"Bearer {token}"}, timeout=10)

    statuses = [ask(f"guess-{i}").status for i in range(12)]
    assert statuses[:10] == [401] * 10 and statuses[-1] == 429, statuses
    refused = ask(node.token)  # shut out: even the right token waits
    assert refused.status == 429 and int(refused.headers["Retry-After"]) >= 1
    assert json.loads(refused.data)["error"]["code"] == "TOO_MANY_FAILED_LOGINS"
    other = urllib3.PoolManager(retries=False).request(
        "POST", f"http://{node.process.endpoint}/v1/sql", json=_SQL, headers={"Authorization": f"Bearer {node.token}"})
    assert other.status == 200  # another peer is not
    wait_for(lambda: ask(node.token).status == 200, 10, "the shut-out to end")
    log = node.process.log.read_text()
    assert "failed login from 127.0.0.2" in log and node.token not in log and SECRET not in log


def test_the_cluster_secret_is_never_shown(nodes) -> None:
    for n in nodes.values():
        for path in ("/v1/metadata", "/metrics", "/openapi.json"):
            resp = urllib3.PoolManager(retries=False, ssl_context=n.context()).request(
                "GET", f"{n.scheme}://{n.process.endpoint}{path}",
                headers={"Authorization": f"Bearer {n.token}"} if n.token else {}, timeout=10)
            assert resp.status == 200 and SECRET.encode() not in resp.data, (n.setup, path)
        assert SECRET not in n.process.log.read_text() and WRONG not in n.process.log.read_text(), n.setup
