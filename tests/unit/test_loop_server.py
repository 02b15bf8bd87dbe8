"""The loop server (`--server loop`) over real sockets: HTTP/1.1 as clients send it (keep-alive,
pipelining, chunked bodies, Expect: 100-continue, HEAD), the 413 of an oversized body, answers
streamed with flow control, TLS, and the point answers given on the loop byte for byte as the
Flask routes give them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from federator.auth import Users, Verifier
from federator.http import create_app, sql_routes
from federator.http.failure_marks import failure_at_end
from federator.http.loop_answers import LoopAnswers
from federator.http.loop_server import LoopServer
from federator.http.wsgi_bridge import Request
from federator.metrics import Metrics
from federator.sql import limits
from federator.sql.limits import Admission, Limits
from federator.sql.result import SqlRequest, SqlResult
from federator.tls import Tls
from tests.certificates import make_certificate
from tests.registry import REGISTRY
from tests.unit.test_sql_routes import LOOKUP_SCHEMA, FakeSqlNode, MidStreamFailure, run

CAP = 2000  # the fake node's --max-body-bytes


class PointNode(FakeSqlNode):
    """A node whose statements are point answers (Python rows), and which says it can give
    them at once unless the key is "far" (on another node)."""

    limits = Limits(max_body_bytes=CAP)

    def __init__(self) -> None:
        super().__init__()
        self.admission = Admission(1, 4)
        self.asked_at_once: list[Any] = []

    def sql(self, request: SqlRequest) -> SqlResult:
        self.requests.append(request)
        return self.point(request)

    @staticmethod
    def point(request: SqlRequest) -> SqlResult:
        key = request.parameters[0] if request.parameters else "alice"
        stats = {"partitions_queried": 1, "nodes": 1, "rows": 1, "elapsed_ms": 0.25}
        return SqlResult(LOOKUP_SCHEMA, iter([]), "tok-p", stats, rows=[(key, 120, b"\x89PNG", 1_700_000_000_000)])

    def answer_now(self, request: SqlRequest) -> SqlResult | None:
        self.asked_at_once.append(request)
        return None if request.parameters == ["far"] or request.consistency_token else self.sql(request)

    def lookup_now(self, store: str, key: str) -> SqlResult | None:
        self.asked_at_once.append(key)
        return None if key == "far" else self.lookup(store, key)


class RoutingNode(PointNode):
    """A PointNode that reads a "far" key from its owner on the loop (``delay`` seconds later),
    and a "gone" one not (its owner cannot answer so: then its threads answer). ``routed``: the
    keys read so, ``let_go``: those whose read stopped before its end."""

    def __init__(self, delay: float = 0.0) -> None:
        super().__init__()
        self.delay = delay
        self.routed: list[str] = []
        self.let_go: list[str] = []
        self.metrics = Metrics()

    def answer_now(self, request: SqlRequest) -> SqlResult | Routed | None:  # ``requests``: only what threads were asked
        self.asked_at_once.append(request)
        key = request.parameters[0] if request.parameters else None
        return Routed(self, key, lambda: self.point(request)) if key in ("far", "gone") else self.point(request)

    def lookup_now(self, store: str, key: str) -> SqlResult | Routed | None:
        self.asked_at_once.append(key)
        return Routed(self, key, lambda: self.lookup(store, key)) if key in ("far", "gone") else self.lookup(store, key)


class Routed:
    """The RoutedPoint SqlEngine.point_now gives for a key another node owns, as RoutingNode plays it."""

    def __init__(self, node: RoutingNode, key: str, result: Any) -> None:
        self.node, self.key, self.result = node, key, result

    async def answer(self) -> SqlResult | None:
        self.node.routed.append(self.key)
        try:
            await asyncio.sleep(self.node.delay)
        except asyncio.CancelledError:
            self.node.let_go.append(self.key)
            raise
        return None if self.key == "gone" else self.result()


def echo(environ: dict[str, Any], start_response: Any) -> Any:
    """A WSGI app: /slow sleeps first, /stream yields its lines, others echo the request."""
    path = environ["PATH_INFO"]
    if path == "/slow":
        time.sleep(0.3)
    if path == "/stream":
        start_response("200 OK", [("Content-Type", "text/plain")])
        return (b"line %d\n" % i for i in range(int(environ["QUERY_STRING"] or 3)))
    body = environ["wsgi.input"].read()
    out = json.dumps({"method": environ["REQUEST_METHOD"], "path": path, "body": body.decode(),
                      "port": environ["REMOTE_PORT"]}).encode()
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(out)))])
    return [out]


class Front:
    """Answers /fast on the loop; caps bodies like the node does."""

    def __init__(self) -> None:
        self.answers = LoopAnswers(PointNode())

    def at_once(self, req: Request) -> Any:
        return echo if req.path == "/fast" else None

    def body_cap(self, path: str) -> int | None:
        return self.answers.body_cap(path)

    def too_large(self, size: str) -> Any:
        return self.answers.too_large(size)


@contextlib.contextmanager
def serving(app: Any, front: Any = None, tls: Tls | None = None, threads: int = 4,
            idle_s: float = 60.0) -> Iterator[LoopServer]:
    server = LoopServer(app, "127.0.0.1", 0, threads=threads, front=front, tls=tls, idle_s=idle_s)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    assert server.listening.wait(10)
    try:
        yield server
    finally:
        server.stop()
        thread.join(15)
        assert not thread.is_alive()


class Conn:
    """A raw HTTP/1.1 connection: send bytes, read answers one by one."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.file = self.sock.makefile("rb")

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def answer(self, head_only: bool = False) -> tuple[int, dict[str, str], bytes]:
        status = int(self.file.readline().split()[1])
        headers: dict[str, str] = {}
        while (line := self.file.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        if head_only or status == 100:
            return status, headers, b""
        if headers.get("transfer-encoding") == "chunked":
            body = b""
            while (size := int(self.file.readline().strip(), 16)):
                body += self.file.read(size)
                self.file.readline()
            self.file.readline()
            return status, headers, body
        if "content-length" in headers:
            return status, headers, self.file.read(int(headers["content-length"]))
        return status, headers, self.file.read()

    def close(self) -> None:
        self.file.close()
        self.sock.close()


def get(path: str, extra: str = "") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: t\r\n{extra}\r\n".encode()


def post(path: str, body: bytes, extra: str = "") -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


@pytest.fixture
def server() -> Iterator[LoopServer]:
    with serving(echo, Front()) as s:
        yield s


def test_keep_alive_serves_requests_one_after_another_on_one_connection(server) -> None:
    conn = Conn(server.port)
    conn.send(get("/a"))
    first = json.loads(conn.answer()[2])
    conn.send(post("/b", b"hello"))
    second = json.loads(conn.answer()[2])
    assert (first["path"], second["path"], second["body"]) == ("/a", "/b", "hello")
    assert first["port"] == second["port"]  # the same connection


def test_pipelined_requests_are_answered_in_order_whichever_is_ready_first(server) -> None:
    conn = Conn(server.port)
    # /slow is made on a thread for 0.3 s; /fast is answered on the loop, but only after it
    conn.send(get("/slow") + get("/fast") + post("/c", b"xyz") + get("/fast?x=%41"))
    paths = [json.loads(conn.answer()[2])["path"] for _ in range(4)]
    assert paths == ["/slow", "/fast", "/c", "/fast"]


def test_a_chunked_request_body_reaches_the_app_whole(server) -> None:
    conn = Conn(server.port)
    conn.send(b"POST /c HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
              b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n" + get("/after"))
    assert json.loads(conn.answer()[2])["body"] == "hello world"
    assert json.loads(conn.answer()[2])["path"] == "/after"


def test_expect_100_continue_is_answered_before_the_body_is_sent(server) -> None:
    conn = Conn(server.port)
    conn.send(b"POST /c HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
    assert conn.answer()[0] == 100
    conn.send(b"data")
    assert json.loads(conn.answer()[2])["body"] == "data"


def test_an_oversized_body_gets_the_sql_routes_413_and_the_connection_goes_on(server) -> None:
    expected = Limits(max_body_bytes=CAP).body_too_large(f"{CAP + 1:,}").to_json()
    conn = Conn(server.port)
    conn.send(post("/v1/sql", b"x" * (CAP + 1)) + get("/after"))
    status, headers, body = conn.answer()
    assert (status, headers["content-type"], body) == (413, "application/json", expected)
    assert json.loads(conn.answer()[2])["path"] == "/after"  # the refused body was read and dropped
    # chunked, so its size shows only as it comes
    conn.send(b"POST /v1/sql HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
              + b"".join(b"3e8\r\n" + b"y" * 1000 + b"\r\n" for _ in range(3)) + b"0\r\n\r\n")
    status, _, body = conn.answer()
    assert status == 413 and json.loads(body)["error"]["message"].startswith(f"the request body is more than {CAP:,}")


def test_node_to_node_bodies_are_not_capped(server) -> None:
    conn = Conn(server.port)
    conn.send(post("/internal/v1/query", b"z" * (CAP * 3)))
    assert len(json.loads(conn.answer()[2])["body"]) == CAP * 3


def test_head_answers_headers_without_a_body() -> None:
    with serving(create_app(PointNode(), REGISTRY)) as s:
        conn = Conn(s.port)
        conn.send(b"HEAD /healthz HTTP/1.1\r\nHost: t\r\n\r\n" + get("/healthz"))
        status, headers, _ = conn.answer(head_only=True)
        assert status == 200 and int(headers["content-length"]) > 0
        status, _, body = conn.answer()  # the next answer starts right after the head
        assert status == 200 and json.loads(body)["status"] == "up"


def test_a_streamed_answer_is_sent_chunked_as_it_comes(server) -> None:
    conn = Conn(server.port)
    conn.send(get("/stream") + get("/after"))
    status, headers, body = conn.answer()
    assert headers["transfer-encoding"] == "chunked" and body == b"line 0\nline 1\nline 2\n"
    assert json.loads(conn.answer()[2])["path"] == "/after"


@pytest.mark.parametrize(("fmt", "says"), [("table", "error: TIMEOUT: partition 5"),
                                           ("csv", "was cut off"), ("arrow", "was cut off")])
def test_a_failure_mid_stream_reaches_the_client(monkeypatch, fmt: str, says: str) -> None:
    """The body ends with the route's error marker, then is cut off (never ended as a whole one)."""
    monkeypatch.setattr(limits, "READ_AHEAD_BYTES", 1)  # the failure comes after the answer has started
    with serving(create_app(MidStreamFailure(rows_before=5000), REGISTRY)) as s:
        code, out, err, raw = run(["--url", f"http://127.0.0.1:{s.port}", "--format", fmt, "SELECT 1"])
    assert code == 2 and says in err, err
    if fmt != "table":
        assert failure_at_end(fmt, raw[-4096:]) is not None  # what was sent ends with the marker


def test_a_client_that_does_not_read_holds_the_producer_back() -> None:
    made = []

    def big(environ: dict[str, Any], start_response: Any) -> Any:
        start_response("200 OK", [("Content-Type", "application/octet-stream")])
        for i in range(400):  # 400 MiB if nothing held it back
            made.append(i)
            yield b"b" * (1 << 20)

    with serving(big) as s:
        conn = Conn(s.port)
        conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
        conn.send(get("/"))
        time.sleep(1.0)
        assert 0 < len(made) < 40  # the socket's and the loop's buffers, a few MiB; not the whole answer
        conn.close()
        time.sleep(0.5)  # the producer hears the client is gone at its next chunk
        stopped_at = len(made)
        time.sleep(0.3)
        assert len(made) == stopped_at < 400


def test_a_request_that_is_not_http_gets_a_400_error_body_after_the_answers_before_it(server) -> None:
    conn = Conn(server.port)
    conn.send(get("/slow") + b"NOT HTTP AT ALL\r\n\r\n")
    assert json.loads(conn.answer()[2])["path"] == "/slow"
    status, headers, body = conn.answer()
    assert status == 400 and json.loads(body)["error"]["code"] == "BAD_REQUEST"
    assert headers["connection"] == "close" and conn.file.read() == b""  # then the server closes


def test_an_upgrade_is_not_taken_its_request_is_answered_in_http_1_1_and_the_connection_ends(server) -> None:
    conn = Conn(server.port)
    conn.send(get("/a", "Connection: Upgrade\r\nUpgrade: h2c\r\n"))
    assert json.loads(conn.answer()[2])["path"] == "/a"
    assert conn.file.read() == b""


def test_idle_connections_are_closed_and_busy_ones_are_not() -> None:
    with serving(echo, Front(), idle_s=0.4) as s:
        idle, half, busy = Conn(s.port), Conn(s.port), Conn(s.port)
        idle.send(get("/a"))
        idle.answer()
        half.send(b"GET /a HTTP/1.1\r\nHost:")  # a request that stops coming
        busy.send(get("/slow") + get("/slow") + get("/slow") + get("/slow"))  # answered for 1.2 s
        time.sleep(1.0)
        assert idle.file.read() == b"" and half.file.read() == b""  # closed by the server
        assert [json.loads(busy.answer()[2])["path"] for _ in range(4)] == ["/slow"] * 4


def test_a_taken_port_is_refused_saying_so(server) -> None:
    with pytest.raises(OSError, match=f"port {server.port} on 127.0.0.1 is already in use"):
        LoopServer(echo, "127.0.0.1", server.port)


def test_tls_is_served_with_the_nodes_certificate(tmp_path: Path) -> None:
    cert, key = make_certificate(tmp_path)
    with serving(echo, Front(), tls=Tls(cert, key)) as s:
        context = ssl.create_default_context(cafile=str(cert))
        with context.wrap_socket(socket.create_connection(("127.0.0.1", s.port), timeout=10),
                                 server_hostname="127.0.0.1") as tls_sock:
            tls_sock.sendall(get("/fast", "Connection: close\r\n"))
            data = b""
            while chunk := tls_sock.recv(65536):
                data += chunk
        assert data.startswith(b"HTTP/1.1 200 OK") and b'"path": "/fast"' in data


# ---- the point answers given on the loop, as the Flask routes give them ----------------------

SQL = json.dumps({"sql": "SELECT * FROM scores WHERE player = ?", "parameters": ["alice"]}).encode()


def answers_of(node: PointNode, requests: list[bytes], on_loop: bool, users: Users | None = None) -> list[bytes]:
    """The raw answers (status line, headers, body) to ``requests``, on the loop or all on threads."""
    app = create_app(node, REGISTRY, users=users)
    with serving(app, LoopAnswers(node, users) if on_loop else None) as s:
        conn = Conn(s.port)
        conn.send(b"".join(requests))
        raw = []
        for _ in requests:
            status, headers, body = conn.answer()
            raw.append(json.dumps([status, sorted(headers.items())]).encode() + b"\n" + body)
        return raw


POINT_REQUESTS = [
    post("/v1/sql", SQL),  # a point query this node reads itself: answered on the loop
    post("/v1/sql", json.dumps({"sql": "SELECT 1", "parameters": ["far"]}).encode()),  # another node's: a thread
    post("/v1/sql", json.dumps({"sql": "SELECT 1", "format": "ndjson"}).encode()),  # not JSON: a thread
    post("/v1/sql", json.dumps({"sql": "SELECT 1", "consistency_token": "t"}).encode()),  # a token: a thread
    post("/v1/sql", b'{"sql": 5}'),  # an error: a thread
    post("/v1/sql", SQL, "Accept: text/csv\r\n"),  # CSV asked in a header: a thread
    post("/v1/sql", SQL, "Accept: text/html\r\nAccept: text/csv\r\n"),  # a header sent twice: as one
    get("/v1/stores/scores/keys/alice"),
    get("/v1/stores/scores/keys/nobody"),  # 404
    get("/v1/stores/scores/keys/far"),
    get("/v1/stores/scores/keys/%61lice"),  # a path to decode
]


def test_answers_given_on_the_loop_are_byte_for_byte_the_routes() -> None:
    on_loop, on_threads = PointNode(), PointNode()
    assert answers_of(on_loop, POINT_REQUESTS, True) == answers_of(on_threads, POINT_REQUESTS, False)
    assert on_threads.asked_at_once == []
    # the loop answered the local reads itself; the rest went on to the routes, which read again
    assert [(r.parameters, r.consistency_token) for r in on_loop.asked_at_once if isinstance(r, SqlRequest)] \
        == [(["alice"], None), (["far"], None), ([], "t")]
    assert [k for k in on_loop.asked_at_once if isinstance(k, str)] == ["alice", "nobody", "far", "alice"]
    assert [r.parameters for r in on_loop.requests] == [["alice"], ["far"], [], [], ["alice"], ["alice"]]


def test_a_statement_the_loop_hands_to_a_thread_is_read_once(monkeypatch) -> None:
    read: list[Any] = []
    real = sql_routes.sql_request_from_body
    monkeypatch.setattr(sql_routes, "sql_request_from_body", lambda body, limits: read.append(body) or real(body, limits))
    requests = [r for r in POINT_REQUESTS if r.startswith(b"POST")]
    answers_of(PointNode(), requests, False)
    on_threads, read[:] = list(read), []
    answers_of(PointNode(), requests, True)
    # as many reads as on threads alone; a body in error is read again, on the thread that answers it
    assert sorted(map(repr, read)) == sorted(map(repr, on_threads + [{"sql": 5}]))


def test_the_loop_checks_bearer_tokens_as_the_app_does(tmp_path: Path) -> None:
    users = Users({"ann": Verifier.of("ann-token", iterations=4096)})
    authorized = "Authorization: Bearer ann-token\r\n"
    requests = [post("/v1/sql", SQL), post("/v1/sql", SQL, "Authorization: Bearer wrong\r\n"),
                post("/v1/sql", SQL, authorized), get("/v1/stores/scores/keys/alice", authorized)]
    on_loop = answers_of(PointNode(), requests, True, users)
    assert on_loop == answers_of(PointNode(), requests, False, Users(users.verifiers))
    assert [json.loads(a.split(b"\n", 1)[0])[0] for a in on_loop] == [401, 401, 200, 200]


def test_a_busy_node_hands_point_queries_to_its_threads() -> None:
    node = PointNode()
    slot = node.admission.enter(1.0)  # the node's one slot is taken: the loop would have to wait
    try:
        with serving(create_app(node, REGISTRY), LoopAnswers(node), threads=4) as s:
            conn = Conn(s.port)
            conn.send(post("/v1/sql", SQL))
            threading.Timer(0.3, slot.release).start()
            status, _, body = conn.answer()
    finally:
        slot.release()
    assert status == 200 and json.loads(body)["stats"]["queued_ms"] > 0  # it waited on a thread, not the loop
    assert node.asked_at_once == []


# ---- point reads of another node's keys, awaited on the loop ---------------------------------

def routed_sql(key: str) -> bytes:
    return post("/v1/sql", json.dumps({"sql": "SELECT * FROM scores WHERE player = ?", "parameters": [key]}).encode())


def test_routed_answers_given_on_the_loop_are_byte_for_byte_the_routes() -> None:
    requests = [routed_sql("far"), routed_sql("gone"), get("/v1/stores/scores/keys/far"),
                get("/v1/stores/scores/keys/gone"), post("/v1/sql", SQL)]
    on_loop, on_threads = RoutingNode(), RoutingNode()
    assert answers_of(on_loop, requests, True) == answers_of(on_threads, requests, False)
    assert on_loop.routed == ["far", "gone", "far", "gone"] and on_threads.routed == []
    # a read the owner could not answer went on to the routes, and only that one
    assert [r.parameters for r in on_loop.requests] == [["gone"]]
    counted = {(route, answered): on_loop.metrics.registry.get_sample_value(
        "federator_loop_server_requests_total", {"route": route, "answered": answered})
        for route in ("sql", "lookup") for answered in ("at_once", "from_owner", "threads")}
    assert counted == {("sql", "at_once"): 1, ("sql", "from_owner"): 1, ("sql", "threads"): 1,
                       ("lookup", "at_once"): None, ("lookup", "from_owner"): 1, ("lookup", "threads"): 1}


def test_pipelined_requests_wait_in_order_for_an_answer_read_from_another_node() -> None:
    node = RoutingNode(delay=0.3)
    with serving(create_app(node, REGISTRY), LoopAnswers(node)) as s:
        conn = Conn(s.port)
        # the read from another node is waited for on the loop; the local read and a thread's
        # answer come after it all the same
        conn.send(routed_sql("far") + post("/v1/sql", SQL) + get("/healthz") + routed_sql("gone"))
        got = [json.loads(conn.answer()[2]) for _ in range(4)]
    assert [g["rows"][0][0] for g in got[:2]] == ["far", "alice"]
    assert got[2]["status"] == "up" and got[3]["rows"][0][0] == "gone"
    assert node.routed == ["far", "gone"] and [r.parameters for r in node.requests] == [["gone"]]


def test_a_read_waiting_for_another_node_holds_no_query_slot_and_is_let_go_when_its_client_goes() -> None:
    node = RoutingNode(delay=30)  # the node has one query slot
    with serving(create_app(node, REGISTRY), LoopAnswers(node)) as s:
        gone = Conn(s.port)
        gone.send(routed_sql("far"))
        time.sleep(0.3)
        assert node.routed == ["far"] and node.let_go == []
        conn = Conn(s.port)  # meanwhile a local read is answered on the loop: the slot is free
        conn.send(post("/v1/sql", SQL))
        status, _, body = conn.answer()
        assert status == 200 and json.loads(body)["rows"][0][0] == "alice" and node.requests == []
        gone.close()
        time.sleep(0.3)
    assert node.let_go == ["far"]


def test_steps_handed_to_the_loop_run_on_its_thread_and_an_error_stops_them_and_reaches_the_caller() -> None:
    ran: list[str] = []

    def steps(fail_at: int | None = None) -> Iterator[None]:
        for i in range(3):
            if i == fail_at:
                raise ValueError("applied badly")
            ran.append(threading.current_thread().name)
            yield

    with serving(echo) as server:
        assert server.run_on_loop(steps())
        assert len(ran) == 3 and len(set(ran)) == 1 and ran[0] != threading.current_thread().name
        ran.clear()
        with pytest.raises(ValueError, match="applied badly"):
            server.run_on_loop(steps(fail_at=1))
        assert len(ran) == 1
        conn = Conn(server.port)  # the loop serves on after it
        conn.send(get("/after"))
        assert conn.answer()[0] == 200


def test_steps_are_declined_when_the_loop_is_not_running() -> None:
    """The caller then runs them itself: before the loop runs, and after it ended."""
    ran: list[int] = []

    def steps(n: int) -> Iterator[None]:
        ran.append(n)
        yield

    server = LoopServer(echo, "127.0.0.1", 0)
    assert not server.run_on_loop(steps(1))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    assert server.listening.wait(10)
    server.stop()
    thread.join(15)
    assert not server.run_on_loop(steps(2))
    assert ran == []
