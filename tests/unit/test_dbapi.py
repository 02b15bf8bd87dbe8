"""The DB-API driver against tiny fake nodes: error mapping, failover, token carrying."""

from __future__ import annotations

import datetime as dt
import decimal
import io
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

import pyarrow as pa
import pytest

import federator.dbapi as dbapi
from federator.query.position import Position
from tests.conftest import free_port


def arrow_bytes(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue()


class FakeNode:
    """Answers POST /v1/sql with the next canned (status, headers, body), recording each request body."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.answers: list[tuple[int, dict, bytes]] = []
        node = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                node.requests.append(json.loads(body))
                status, headers, data = node.answers.pop(0) if node.answers else (200, {}, TABLE_BYTES)
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    def answer(self, status: int = 200, body: bytes | dict | None = None, **headers: str) -> None:
        data = json.dumps(body).encode() if isinstance(body, dict) else (body if body is not None else TABLE_BYTES)
        self.answers.append((status, headers, data))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


TABLE = pa.table({"k": pa.array(["a", "b", "c"]), "n": pa.array([1, None, 3], pa.int64()),
                  "t": pa.array([0, 1, None], pa.timestamp("ms", tz="UTC")), "b": pa.array([b"\x00", None, b"z"])})
TABLE_BYTES = arrow_bytes(TABLE)


@pytest.fixture
def node() -> Iterator[FakeNode]:
    n = FakeNode()
    yield n
    n.close()


@pytest.fixture
def node2() -> Iterator[FakeNode]:
    n = FakeNode()
    yield n
    n.close()


def token(topic: str, **offsets: int) -> str:
    return Position({topic: {int(p[1:]): o for p, o in offsets.items()}}).to_token()


def test_rows_description_and_arrow(node) -> None:
    cur = dbapi.connect(node.url).cursor()
    cur.execute("SELECT * FROM s")
    assert [d[0] for d in cur.description] == ["k", "n", "t", "b"]
    assert [d[1] for d in cur.description] == ["VARCHAR", "BIGINT", "TIMESTAMP WITH TIME ZONE", "BLOB"]
    assert cur.description[0][1] == dbapi.STRING and cur.description[1][1] == dbapi.NUMBER
    assert cur.description[2][1] == dbapi.DATETIME and cur.description[3][1] == dbapi.BINARY
    assert cur.description[1][1] != dbapi.STRING and cur.description[0][1] != dbapi.ROWID
    assert cur.rowcount == 3
    assert cur.fetchone() == ("a", 1, dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc), b"\x00")
    assert cur.fetch_arrow_table().equals(TABLE.slice(1))  # the rest, as sent
    assert cur.fetchall() == [] and cur.fetchone() is None
    cur.execute("SELECT * FROM s")
    cur.arraysize = 2
    assert [r[0] for r in cur.fetchmany()] == ["a", "b"] and [r[0] for r in cur] == ["c"]
    assert node.requests[0]["format"] == "arrow"


def test_parameters_are_sent_as_json_values(node) -> None:
    conn = dbapi.connect(node.url, timeout=2.5, allow_stale=True, max_lag=7)
    when = dt.datetime(2024, 5, 1, 12, 30, tzinfo=dt.timezone.utc)
    conn.cursor().execute("SELECT ?", ["x", 1, 2.5, True, None, when, dt.date(2024, 5, 1), decimal.Decimal("3")])
    body = node.requests[0]
    assert body["parameters"] == ["x", 1, 2.5, True, None, "2024-05-01 12:30:00+00:00", "2024-05-01", 3]
    assert body["timeout_ms"] == 2500 and body["allow_stale"] is True and body["max_lag"] == 7
    with pytest.raises(dbapi.NotSupportedError):
        conn.cursor().execute("SELECT ?", [b"raw"])
    with pytest.raises(dbapi.ProgrammingError):
        conn.cursor().execute("SELECT ?", {"named": 1})
    assert len(node.requests) == 1  # neither bad call reached the node


@pytest.mark.parametrize(("status", "code", "cls"), [
    (400, "SQL_PARSE_ERROR", dbapi.ProgrammingError),
    (400, "INVALID_PARAMETER", dbapi.ProgrammingError),
    (404, "UNKNOWN_STORE", dbapi.ProgrammingError),
    (404, "UNKNOWN_COLUMN", dbapi.ProgrammingError),
    (422, "UNSUPPORTED", dbapi.NotSupportedError),
    (503, "UNAVAILABLE", dbapi.OperationalError),
    (504, "TIMEOUT", dbapi.OperationalError),
    (409, "NOT_UP_TO_BOUND", dbapi.OperationalError),
    (400, "INVALID_DATA", dbapi.DataError),
    (500, "INTERNAL", dbapi.InternalError),
    (418, "SOMETHING_NEW", dbapi.DatabaseError),
])
def test_error_codes_map_to_pep249_classes(node, node2, status, code, cls) -> None:
    node.answer(status, {"error": {"code": code, "message": "what went wrong", "line": 2, "col": 5}}, **{"Retry-After": "1"})
    conn = dbapi.connect(f"{node.url},{node2.url}")
    with pytest.raises(cls) as info:
        conn.cursor().execute("SELECT 1")
    e = info.value
    assert isinstance(e, dbapi.DatabaseError) and isinstance(e, dbapi.Error)
    assert (e.code, e.message, e.status, e.line, e.col) == (code, "what went wrong", status, 2, 5)
    assert code in str(e) and "what went wrong" in str(e)
    assert node2.requests == []  # an answer, even an error, is the cluster's: no failover


def test_an_error_without_the_services_body(node) -> None:
    node.answer(502, b"<html>bad gateway</html>")
    with pytest.raises(dbapi.OperationalError, match="HTTP 502"):
        dbapi.connect(node.url).cursor().execute("SELECT 1")


def test_a_cut_off_arrow_stream_is_an_operational_error(node) -> None:
    node.answer(200, TABLE_BYTES[: len(TABLE_BYTES) // 2])
    with pytest.raises(dbapi.OperationalError, match="not a complete Arrow stream"):
        dbapi.connect(node.url).cursor().execute("SELECT 1")


def test_failover_to_the_next_node_and_stay_there(node) -> None:
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    conn = dbapi.connect(f"http://{dead},{node.url.removeprefix('http://')}")
    assert conn.cursor().execute("SELECT 1").rowcount == 3
    assert conn.cursor().execute("SELECT 2").rowcount == 3
    assert [r["sql"] for r in node.requests] == ["SELECT 1", "SELECT 2"]


def test_a_node_that_accepts_but_never_answers_is_skipped(node) -> None:
    with socket.socket() as silent:  # listens, so connects succeed, but never reads or answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        conn = dbapi.connect(f"http://127.0.0.1:{silent.getsockname()[1]},{node.url.removeprefix('http://')}",
                             timeout=0.2)
        assert conn.cursor().execute("SELECT 1").rowcount == 3
    assert len(node.requests) == 1


def test_a_tiny_statement_timeout_leaves_the_connection_time_to_be_made(node, monkeypatch) -> None:
    """timeout=0.001 is the statement's (timeout_ms 1, the server's to enforce), not a 1 ms
    connect: the server's 504 TIMEOUT reaches the caller, not "no node answered"."""
    import urllib3

    timeouts: list[urllib3.Timeout] = []
    request = urllib3.PoolManager.request

    def spy(self, *args, **kwargs):
        timeouts.append(kwargs["timeout"])
        return request(self, *args, **kwargs)

    monkeypatch.setattr(urllib3.PoolManager, "request", spy)
    node.answer(504, {"error": {"code": "TIMEOUT", "message": "the query ran past timeout_ms"}})
    with pytest.raises(dbapi.OperationalError) as info:
        dbapi.connect(node.url, timeout=0.001).cursor().execute("SELECT 1")
    assert info.value.code == "TIMEOUT" and node.requests[0]["timeout_ms"] == 1
    (t,) = timeouts
    assert t.connect_timeout >= 0.5 and t.read_timeout >= 0.5


def test_no_node_answers_names_every_node() -> None:
    a, b = free_port(), free_port()
    with pytest.raises(dbapi.OperationalError) as info:
        dbapi.connect(f"http://127.0.0.1:{a},127.0.0.1:{b}").cursor().execute("SELECT 1")
    assert f"127.0.0.1:{a}" in str(info.value) and f"127.0.0.1:{b}" in str(info.value)
    assert info.value.code is None


def test_the_token_is_carried_and_merged(node) -> None:
    t0 = token("a", p0=5)
    t1 = token("a", p0=7, p1=2)
    t2 = token("b", p3=9)
    node.answer(200, None, **{"X-Federator-Consistency-Token": t1})
    node.answer(200, None, **{"X-Federator-Consistency-Token": t2})
    node.answer(200, None)
    conn = dbapi.connect(node.url, token=t0)
    cur = conn.cursor()
    cur.execute("SELECT 1")
    assert cur.consistency_token == t1 and conn.consistency_token == t1
    cur.execute("SELECT 2")
    cur.execute("SELECT 3")
    sent = [r["consistency_token"] for r in node.requests]
    assert sent[:2] == [t0, t1]
    # an answer about another store adds to the floor instead of replacing it
    assert Position.from_token(sent[2]) == Position({"a": {0: 7, 1: 2}, "b": {3: 9}})
    assert conn.consistency_token == sent[2]


def test_connection_and_cursor_lifecycle(node) -> None:
    with dbapi.connect(node.url) as conn:
        conn.commit()
        with pytest.raises(dbapi.NotSupportedError):
            conn.rollback()
        with conn.cursor() as cur:
            with pytest.raises(dbapi.ProgrammingError):
                cur.fetchone()  # nothing executed yet
            assert cur.description is None and cur.rowcount == -1
            cur.executemany("SELECT ?", [["x"], ["y"]])
            assert cur.rowcount == 6 and [r["parameters"] for r in node.requests] == [["x"], ["y"]]
        with pytest.raises(dbapi.InterfaceError):
            cur.fetchall()
    with pytest.raises(dbapi.InterfaceError):
        conn.cursor()
    assert dbapi.apilevel == "2.0" and dbapi.paramstyle == "qmark" and dbapi.threadsafety in (1, 2, 3)


@pytest.mark.parametrize("url", ["localhost:8080", "ftp://a:1", "http://a:port", "http://,"])
def test_bad_urls_are_interface_errors(url) -> None:
    with pytest.raises(dbapi.InterfaceError):
        dbapi.connect(url)
