"""Limits and admission (federator.sql.limits) alone, then on POST /v1/sql against a fake node:
413 for a body over the cap, 400 for SQL over the cap, 422 for an answer over a cap, a timeout
over the maximum clamped and reported, 429 with Retry-After when the slots and the queue are
full, and node-to-node calls never refused for the public load."""

from __future__ import annotations

import io
import json
import threading
import time
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from federator.cli import build_parser
from federator.errors import SqlError
from federator.flight.errors import flight_error
from federator.http import create_app
from federator.http.sql_routes import sql_response
from federator.node_command import _limits
from federator.settings import NodeSettings, from_args, parse_size
from federator.sql.limits import Admission, Limits
from federator.sql.result import SqlRequest, SqlResult
from tests.registry import REGISTRY
from tests.unit.test_http_app import FakeNode as InternalNode
from tests.unit.test_http_app import query_body

SCHEMA = pa.schema([("k", pa.int64()), ("s", pa.string())])


def batch(start: int, n: int, width: int = 1) -> pa.RecordBatch:
    return pa.record_batch([pa.array(range(start, start + n), pa.int64()), pa.array(["x" * width] * n)], schema=SCHEMA)


def refusal(fn: Any, *args: Any) -> SqlError:
    with pytest.raises(SqlError) as info:
        fn(*args)
    return info.value


# --- the limits alone -------------------------------------------------------------------------


def test_sizes_take_units() -> None:
    assert parse_size("1048576", "--x") == 1048576
    assert parse_size("64KB", "--x") == 64_000 and parse_size("16MiB", "--x") == 16 * 1024 * 1024
    assert parse_size("1gib", "--x") == 1024**3 and parse_size(" 2 GB ", "--x") == 2 * 1000**3
    for bad in ("", "1.5GB", "-1", "ten", "1 PB"):
        with pytest.raises(ValueError, match="--x must be a size"):
            parse_size(bad, "--x")


def test_limits_refuse_values_that_make_no_sense() -> None:
    with pytest.raises(ValueError, match="--max-running-queries must be 1 or more"):
        Limits(max_running=0)
    with pytest.raises(ValueError, match="--max-sql-chars can be at most 1048576"):
        Limits(max_sql_chars=2 * 1024 * 1024)
    Limits(max_answer_rows=0, max_answer_bytes=0, max_queued=0)  # 0: no answer cap, no queue


def test_public_queries_must_leave_threads_for_node_to_node_calls() -> None:
    Limits(max_running=8, max_queued=6).check_threads(16)
    with pytest.raises(ValueError) as info:
        Limits(max_running=8, max_queued=6).check_threads(8)
    assert "--threads 16 or more" in str(info.value) and "node-to-node" in str(info.value)


def _node(argv: list[str]) -> NodeSettings:
    args = build_parser().parse_args(["node", "--application-id", "a", "--state-dir", "/tmp/x", *argv])
    return from_args(args, {}).settings


def test_node_flags_make_the_limits(capsys: pytest.CaptureFixture[str]) -> None:
    limits = _limits(_node([]))
    assert limits == Limits()  # the flags' defaults are the module's
    limits = _limits(_node(["--max-body-bytes", "64KB", "--max-answer-bytes", "1MiB", "--max-answer-rows", "100",
                            "--max-sql-chars", "4096", "--max-timeout-ms", "5000", "--max-running-queries", "1",
                            "--max-queued-queries", "0"]))
    assert limits == Limits(max_body_bytes=64_000, max_sql_chars=4096, max_answer_rows=100,
                            max_answer_bytes=1024 * 1024, max_timeout_ms=5000, max_running=1, max_queued=0)
    with pytest.raises(ValueError, match="--threads"):
        _limits(_node(["--threads", "4"]))
    with pytest.raises(SystemExit):
        _node(["--max-answer-bytes", "lots"])
    assert "--max-answer-bytes must be a size" in capsys.readouterr().err


def test_sql_over_the_cap_is_a_400_naming_the_flag() -> None:
    limits = Limits(max_sql_chars=10)
    limits.check_sql("SELECT 123")
    err = refusal(limits.check_sql, "SELECT 1234")
    assert err.status == 400 and err.code == "SQL_TOO_LONG"
    assert "11 characters" in err.message and "--max-sql-chars" in err.message and "parameters" in err.message


def test_a_timeout_over_the_maximum_is_clamped() -> None:
    limits = Limits(max_timeout_ms=5000)
    assert limits.timeout_ms(5000) == (5000, False) and limits.timeout_ms(5001) == (5000, True)
    err = limits.timed_out(SqlError("TIMEOUT", "the query ran past timeout_ms"))
    assert err.status == 504 and "capped at 5,000" in err.message and "--max-timeout-ms" in err.message
    other = SqlError("UNAVAILABLE", "no")
    assert limits.timed_out(other) is other


def test_an_answer_over_the_row_cap_is_a_422_saying_how_to_page() -> None:
    capped = Limits(max_answer_rows=5).capped(iter([batch(0, 3), batch(3, 3)]))
    err = refusal(capped.read_ahead)
    assert err.status == 422 and err.code == "ANSWER_TOO_LARGE"
    for words in ("more than 5 rows", "--max-answer-rows 5", "LIMIT", "OFFSET", "WHERE on the store's key"):
        assert words in err.message, err.message
    ok = Limits(max_answer_rows=6).capped(iter([batch(0, 3), batch(3, 3)]))
    assert ok.read_ahead() and sum(b.num_rows for b in ok) == 6


def test_an_answer_over_the_byte_cap_is_a_422() -> None:
    big = batch(0, 10, width=1000)
    err = refusal(Limits(max_answer_bytes=big.nbytes - 1).capped(iter([big])).read_ahead)
    assert err.code == "ANSWER_TOO_LARGE" and "--max-answer-bytes" in err.message and "as Arrow" in err.message
    assert list(Limits(max_answer_bytes=0, max_answer_rows=0).capped(iter([big]))) == [big]  # 0: no cap


def test_past_the_read_ahead_the_cap_is_found_while_streaming() -> None:
    """What is read ahead comes out first, in order; a cap passed later raises where it is passed."""
    capped = Limits(max_answer_rows=5).capped(iter([batch(0, 2), batch(2, 2), batch(4, 2)]))
    assert capped.read_ahead(budget=1) is False  # one batch read, the answer not yet whole
    out = [next(capped), next(capped)]
    assert [b.column(0)[0].as_py() for b in out] == [0, 2]
    assert refusal(next, capped).code == "ANSWER_TOO_LARGE"


def test_close_reaches_the_source() -> None:
    closed = []

    def source() -> Iterator[pa.RecordBatch]:
        try:
            yield batch(0, 1)
            yield batch(1, 1)
        finally:
            closed.append(True)

    capped = Limits().capped(source())
    capped.read_ahead(budget=1)
    capped.close()
    assert closed == [True]


# --- admission --------------------------------------------------------------------------------


def wait_until(cond: Any, give_up_s: float = 30.0) -> None:
    """Until ``cond()`` holds (the limit only stops a broken test from hanging)."""
    deadline = time.monotonic() + give_up_s
    while not cond():
        assert time.monotonic() < deadline, "gave up waiting"
        time.sleep(0.001)


def test_slots_queue_and_refusal() -> None:
    admission = Admission(max_running=1, max_queued=1)
    first = admission.enter(10)
    assert admission.state() == {"running": 1, "queued": 0, "max_running": 1, "max_queued": 1}
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(admission.enter(10)))
    waiter.start()
    wait_until(lambda: admission.state()["queued"] == 1)
    err = refusal(admission.enter, 10)  # one running, one waiting: no room
    assert err.status == 429 and err.code == "TOO_MANY_QUERIES" and err.retry_after == 1.0
    assert "--max-running-queries" in err.message and "--max-queued-queries" in err.message
    first.release()
    waiter.join()
    assert admission.state()["running"] == 1 and admission.state()["queued"] == 0  # handed over, not freed
    first.release()  # a second release changes nothing
    assert admission.state()["running"] == 1
    got[0].release()
    assert admission.state()["running"] == 0


def test_a_query_that_waits_its_whole_timeout_is_refused_and_leaves_the_queue() -> None:
    admission = Admission(max_running=1, max_queued=1)
    slot = admission.enter(10)
    err = refusal(admission.enter, 0)
    assert err.code == "TOO_MANY_QUERIES" and "its whole timeout_ms" in err.message
    assert admission.state()["queued"] == 0
    slot.release()
    admission.enter(0).release()  # free again: no wait


def test_waiting_queries_are_served_in_arrival_order() -> None:
    admission = Admission(max_running=1, max_queued=3)
    slot = admission.enter(10)
    order: list[int] = []
    slots: list[Any] = []

    def wait(i: int) -> None:
        s = admission.enter(10)
        order.append(i)
        slots.append(s)

    threads = []
    for i in range(3):
        threads.append(threading.Thread(target=wait, args=(i,)))
        threads[-1].start()
        wait_until(lambda: admission.state()["queued"] == i + 1)
    for _ in range(3):
        slot.release()
        wait_until(lambda: len(slots) == 3 - admission.state()["queued"])
        slot = slots[-1]
    slot.release()
    for t in threads:
        t.join()
    assert order == [0, 1, 2] and admission.state()["running"] == 0


def test_flight_errors_for_the_limits() -> None:
    assert isinstance(flight_error(SqlError("TOO_MANY_QUERIES", "busy")), flight.FlightUnavailableError)
    assert isinstance(flight_error(SqlError("ANSWER_TOO_LARGE", "big")), pa.ArrowInvalid)
    assert isinstance(flight_error(SqlError("SQL_TOO_LONG", "long")), pa.ArrowInvalid)


# --- on POST /v1/sql ----------------------------------------------------------------------------


class LimitedNode:
    """A fake SQL node with limits and admission, like SqlService; each answer is ``batches``."""

    node_id, state, cluster_secret = "node-a", "RUNNING", None

    def __init__(self, limits: Limits, batches: int = 2, rows: int = 3) -> None:
        self.limits, self.admission = limits, Admission.of(limits)
        self.batches, self.rows = batches, rows
        self.requests: list[SqlRequest] = []
        self.running_seen: list[int] = []

    def sql(self, request: SqlRequest) -> SqlResult:
        self.requests.append(request)
        self.running_seen.append(self.admission.state()["running"])
        return SqlResult(SCHEMA, iter([batch(i * self.rows, self.rows) for i in range(self.batches)]), "tok",
                         {"rows": self.batches * self.rows})


def post(node: Any, body: bytes, **environ: Any) -> tuple[int, dict, dict]:
    env = {"REQUEST_METHOD": "POST", "PATH_INFO": "/v1/sql", "CONTENT_LENGTH": str(len(body)),
           "wsgi.input": io.BytesIO(body), **environ}
    resp = sql_response(node, env)
    out: dict[str, Any] = {}

    def start_response(status: str, headers: list) -> None:
        out["status"], out["headers"] = int(status.split()[0]), dict(headers)

    data = b"".join(resp(env, start_response))
    return out["status"], json.loads(data), out["headers"]


def sql_body(sql: str, **fields: Any) -> bytes:
    return json.dumps({"sql": sql, **fields}).encode()


def assert_error(status: int, body: dict, want: int, code: str, *words: str) -> str:
    assert status == want, body
    err = body["error"]
    assert err["code"] == code, err
    for w in words:
        assert w in err["message"], err["message"]
    return err["message"]


def test_http_body_and_sql_caps() -> None:
    node = LimitedNode(Limits(max_body_bytes=100, max_sql_chars=20))
    status, body, _ = post(node, sql_body("SELECT 1", parameters=["x" * 100]))
    assert_error(status, body, 413, "REQUEST_TOO_LARGE", "at most 100 bytes", "--max-body-bytes")
    status, body, _ = post(node, sql_body("SELECT 1 + 1 + 1 + 1 + 1"))
    assert_error(status, body, 400, "SQL_TOO_LONG", "--max-sql-chars")
    assert node.requests == [] and node.admission.state()["running"] == 0


def test_http_answer_over_a_cap_is_a_422_and_the_slot_is_freed() -> None:
    node = LimitedNode(Limits(max_answer_rows=5), batches=2, rows=3)
    for fmt in ("json", "csv", "arrow"):
        status, body, _ = post(node, sql_body("SELECT * FROM t", format=fmt))
        assert_error(status, body, 422, "ANSWER_TOO_LARGE", "--max-answer-rows 5", "LIMIT")
    assert node.admission.state()["running"] == 0
    status, body, _ = post(LimitedNode(Limits(max_answer_rows=6)), sql_body("SELECT * FROM t"))
    assert status == 200 and len(body["rows"]) == 6


def test_http_timeout_over_the_maximum_runs_clamped_and_says_so() -> None:
    node = LimitedNode(Limits(max_timeout_ms=5000))
    status, body, _ = post(node, sql_body("SELECT 1", timeout_ms=60_000))
    assert status == 200 and node.requests[-1].timeout_ms == 5000
    assert body["stats"]["timeout_ms"] == 5000 and body["stats"]["timeout_ms_requested"] == 60_000
    status, body, _ = post(node, sql_body("SELECT 1", timeout_ms=4000))
    assert status == 200 and node.requests[-1].timeout_ms == 4000 and "timeout_ms_requested" not in body["stats"]
    status, body, _ = post(node, sql_body("SELECT 1"))  # the default 10 s, over this node's maximum: not asked
    assert node.requests[-1].timeout_ms == 5000 and "timeout_ms_requested" not in body["stats"]


def test_http_over_concurrency_is_a_429_with_retry_after() -> None:
    node = LimitedNode(Limits(max_running=1, max_queued=0))
    held = node.admission.enter(10)  # a query running
    status, body, headers = post(node, sql_body("SELECT 1"))
    assert_error(status, body, 429, "TOO_MANY_QUERIES", "--max-running-queries", "Retry-After")
    assert headers["Retry-After"] == "1" and node.requests == []
    held.release()
    status, body, _ = post(node, sql_body("SELECT 1"))
    assert status == 200 and node.running_seen == [1] and node.admission.state()["running"] == 0


def test_http_a_streamed_answer_holds_its_slot_until_sent() -> None:
    from federator.http import sql_routes

    node = LimitedNode(Limits(max_running=1, max_queued=0), batches=3, rows=30_000)  # over SMALL_BODY: streamed
    env = {"REQUEST_METHOD": "POST", "PATH_INFO": "/v1/sql", "wsgi.input": io.BytesIO(sql_body("SELECT 1", format="csv"))}
    env["CONTENT_LENGTH"] = str(len(env["wsgi.input"].getvalue()))
    resp = sql_routes.sql_response(node, env)
    body = resp(env, lambda status, headers: None)
    assert node.admission.state()["running"] == 1
    assert sum(len(chunk) for chunk in body) > sql_routes.SMALL_BODY
    body.close()  # what the server does once it has sent the body
    assert node.admission.state()["running"] == 0


def test_node_to_node_calls_are_not_admitted() -> None:
    """/internal/v1/query answers while every public slot is taken (the calls a query on
    another node waits for); the key lookup route is a public query and is refused."""

    class Both(InternalNode):
        def __init__(self) -> None:
            super().__init__()
            self.limits = Limits(max_running=1, max_queued=0)
            self.admission = Admission.of(self.limits)

        def sql(self, request: SqlRequest) -> SqlResult:
            raise AssertionError("not reached")

        def lookup(self, store: str, key: str) -> SqlResult:
            schema = pa.schema([("k", pa.string())])
            return SqlResult(schema, iter([]), "", {}, rows=[(key,)])

    node = Both()
    client = create_app(node, REGISTRY).test_client()
    held = node.admission.enter(10)
    assert client.post("/internal/v1/query", json=query_body()).status_code == 200
    assert client.get("/healthz").status_code == 200
    assert client.get("/v1/metadata").get_json()["local"]["queries"]["running"] == 1
    resp = client.get("/v1/stores/s/keys/a")
    assert resp.status_code == 429 and resp.headers["Retry-After"] == "1"
    assert resp.get_json()["error"]["code"] == "TOO_MANY_QUERIES"
    held.release()
    assert client.get("/v1/stores/s/keys/a").get_json() == {"k": "a"}
    assert node.admission.state()["running"] == 0
