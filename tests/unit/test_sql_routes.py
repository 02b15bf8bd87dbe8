"""POST /v1/sql and /v1/stores against a fake node; `federator sql` against a real waitress server."""

from __future__ import annotations

import io
import json
from typing import Any, Iterator

import pyarrow as pa
import pytest

from federator.cli import build_parser
from federator.cli import main as cli_main
from federator.client.sql_cli import format_table, parse_param, run_sql
from federator.http import bound_port, create_app, serve, shutdown, start
from federator.errors import SqlError
from federator.sql.result import SqlRequest, SqlResult
from tests.http_server import running
from tests.registry import REGISTRY

SCHEMA = pa.schema([("player", pa.string()), ("score", pa.int64()), ("rowtime", pa.timestamp("ms", tz="UTC"))])
ROWS = [
    {"player": "alice", "score": 120, "rowtime": 1_700_000_000_000},
    {"player": "bob", "score": 7, "rowtime": 1_700_000_001_000},
    {"player": "日本", "score": None, "rowtime": None},
]


LOOKUP_SCHEMA = pa.schema([("player", pa.string()), ("score", pa.int64()), ("avatar", pa.binary()),
                           ("rowtime", pa.timestamp("ms", tz="UTC"))])


class FakeSqlNode:
    """Answers every statement with ROWS (one batch per row), or raises what the test sets."""

    node_id, state, cluster_secret = "node-a", "RUNNING", None

    def __init__(self) -> None:
        self.requests: list[SqlRequest] = []
        self.fail_with: Exception | None = None
        self.fail_in_first_batch: Exception | None = None

    def sql(self, request: SqlRequest) -> SqlResult:
        self.requests.append(request)
        if self.fail_with is not None:
            raise self.fail_with
        stats = {"partitions_queried": 4, "nodes": 2, "rows": 0, "elapsed_ms": 0}

        def batches() -> Iterator[pa.RecordBatch]:
            if self.fail_in_first_batch is not None:
                raise self.fail_in_first_batch
            for row in ROWS:
                stats["rows"] += 1
                stats["elapsed_ms"] = 12
                yield pa.RecordBatch.from_pylist([row], schema=SCHEMA)

        return SqlResult(SCHEMA, batches(), "tok-abc", stats)

    def stores_info(self) -> list[dict]:
        return [{"name": "scores", "type": "kv", "partitions": 8}]

    def store_info(self, name: str) -> dict:
        if name != "scores":
            raise SqlError("UNKNOWN_STORE", f"unknown store {name!r}")
        return {"name": "scores", "type": "kv", "partitions": 8, "columns": [{"name": "player", "type": "VARCHAR"}]}

    def lookup(self, store: str, key: str) -> SqlResult:
        """The point query's answer: as Python rows (the SQL point path's), or for "a/b" as
        Arrow batches only (the general path's)."""
        self.store_info(store)
        row = (key, 120, b"\x89PNG", 1_700_000_000_000)  # a row holds a timestamp as its unit's count
        found = [row] if key in ("alice", "a/b", "日本/ü") else []
        batches = iter([pa.RecordBatch.from_pylist([dict(zip(LOOKUP_SCHEMA.names, r)) for r in found],
                                                   schema=LOOKUP_SCHEMA)])
        stats = {"partitions_queried": 1, "nodes": 1, "rows": len(found), "elapsed_ms": 0}
        return SqlResult(LOOKUP_SCHEMA, batches, "tok-abc", stats, rows=None if key == "a/b" else found)


@pytest.fixture
def node() -> FakeSqlNode:
    return FakeSqlNode()


@pytest.fixture
def client(node: FakeSqlNode) -> Any:
    return create_app(node, REGISTRY).test_client()


def assert_error(resp: Any, status: int, code: str, *fragments: str) -> dict:
    assert resp.status_code == status, resp.get_data(as_text=True)
    assert resp.mimetype == "application/json"
    err = resp.get_json()["error"]
    assert err["code"] == code
    for f in fragments:
        assert f in err["message"], err["message"]
    return err


# --- POST /v1/sql ----------------------------------------------------------------------------


def test_sql_json_answer(client: Any, node: FakeSqlNode) -> None:
    body = {"sql": "SELECT * FROM scores WHERE player = ?", "parameters": ["alice", 3, 1.5, None],
            "consistency_token": "t0", "allow_stale": True, "max_lag": 0, "timeout_ms": 500}
    resp = client.post("/v1/sql", json=body)
    assert resp.status_code == 200 and resp.mimetype == "application/json"
    assert resp.get_json() == {
        "columns": [{"name": "player", "type": "VARCHAR"}, {"name": "score", "type": "BIGINT"},
                    {"name": "rowtime", "type": "TIMESTAMP WITH TIME ZONE"}],
        "rows": [["alice", 120, "2023-11-14T22:13:20.000Z"], ["bob", 7, "2023-11-14T22:13:21.000Z"], ["日本", None, None]],
        "consistency_token": "tok-abc",
        "stats": {"partitions_queried": 4, "nodes": 2, "rows": 3, "elapsed_ms": 12},  # final, read after the rows
    }
    assert node.requests == [SqlRequest("SELECT * FROM scores WHERE player = ?", ["alice", 3, 1.5, None], "t0",
                                        True, 0, 500)]


def test_defaults(client: Any, node: FakeSqlNode) -> None:
    assert client.post("/v1/sql", json={"sql": "SELECT 1", "parameters": None, "max_lag": None}).status_code == 200
    assert node.requests == [SqlRequest("SELECT 1")]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "sql"),
        ({"sql": ""}, "sql"),
        ({"sql": "   "}, "sql"),
        ({"sql": 5}, "sql"),
        ({"sql": "SELECT 1", "parameters": "alice"}, "parameters"),
        ({"sql": "SELECT 1", "parameters": {"a": 1}}, "parameters"),
        ({"sql": "SELECT 1", "allow_stale": "yes"}, "allow_stale"),
        ({"sql": "SELECT 1", "allow_stale": 1}, "allow_stale"),
        ({"sql": "SELECT 1", "max_lag": -1}, "max_lag"),
        ({"sql": "SELECT 1", "max_lag": True}, "max_lag"),
        ({"sql": "SELECT 1", "max_lag": 1.5}, "max_lag"),
        ({"sql": "SELECT 1", "timeout_ms": 0}, "timeout_ms"),
        ({"sql": "SELECT 1", "timeout_ms": "100"}, "timeout_ms"),
        ({"sql": "SELECT 1", "timeout_ms": True}, "timeout_ms"),
        ({"sql": "SELECT 1", "timeout_ms": None}, "timeout_ms"),
        ({"sql": "SELECT 1", "consistency_token": 5}, "consistency_token"),
        ({"sql": "SELECT 1", "format": "xml"}, "format"),
        ({"sql": "SELECT 1", "paramters": [1]}, "paramters"),
    ],
)
def test_bad_fields_are_named(client: Any, node: FakeSqlNode, body: dict, field: str) -> None:
    assert_error(client.post("/v1/sql", json=body), 400, "INVALID_PARAMETER", f"'{field}'")
    assert node.requests == []


@pytest.mark.parametrize(("data", "fragment"), [(b"", "empty"), (b"{nope", "not valid JSON"),
                                                 (b"[1]", "JSON object"), (b"\xff", "not valid JSON")])
def test_bad_bodies(client: Any, data: bytes, fragment: str) -> None:
    resp = client.post("/v1/sql", data=data, content_type="application/json")
    assert_error(resp, 400, "INVALID_PARAMETER", fragment)


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (SqlError("SQL_PARSE_ERROR", "unexpected token FORM", line=1, col=10), 400),
        (SqlError("UNKNOWN_STORE", "unknown store 'nope'"), 404),
        (SqlError("UNKNOWN_COLUMN", "no column 'x' in store 'scores'"), 404),
        (SqlError("UNSUPPORTED", "JOIN is not supported"), 422),
        (SqlError("NOT_UP_TO_BOUND", "partition 2 is behind the token", partitions=[2]), 409),
        (SqlError("TIMEOUT", "partitions 1, 2 did not answer within 500 ms", partitions=[1, 2]), 504),
    ],
)
def test_sql_errors_map_to_status_and_body(client: Any, node: FakeSqlNode, error: SqlError, status: int) -> None:
    node.fail_with = error
    resp = client.post("/v1/sql", json={"sql": "SELECT 1"})
    assert resp.status_code == status and resp.get_json() == error.to_dict()
    assert "Retry-After" not in resp.headers


@pytest.mark.parametrize(("retry_after", "header"), [(0.05, "1"), (1.0, "1"), (2.5, "3"), (0, "1")])
def test_unavailable_sets_retry_after(client: Any, node: FakeSqlNode, retry_after: float, header: str) -> None:
    node.fail_with = SqlError("UNAVAILABLE", "no replica of partition 3 is up", partitions=[3], retry_after=retry_after)
    resp = client.post("/v1/sql", json={"sql": "SELECT 1"})
    err = assert_error(resp, 503, "UNAVAILABLE", "partition 3")
    assert err["partitions"] == [3] and resp.headers["Retry-After"] == header


def test_error_in_the_first_batch_still_gets_its_status(client: Any, node: FakeSqlNode) -> None:
    node.fail_in_first_batch = SqlError("UNAVAILABLE", "partition 0 is rebalancing", retry_after=2)
    resp = client.post("/v1/sql", json={"sql": "SELECT 1", "format": "csv"})
    assert_error(resp, 503, "UNAVAILABLE", "rebalancing")
    assert resp.headers["Retry-After"] == "2"


def test_unexpected_exception_is_a_json_500(client: Any, node: FakeSqlNode) -> None:
    node.fail_with = RuntimeError("boom")
    assert_error(client.post("/v1/sql", json={"sql": "SELECT 1"}), 500, "INTERNAL", "boom")


def test_wrong_method_is_json(client: Any) -> None:
    assert_error(client.get("/v1/sql"), 405, "METHOD_NOT_ALLOWED", "POST")


def test_node_without_sql_has_no_sql_routes() -> None:
    class Bare:
        node_id, state, cluster_secret = "n", "RUNNING", None

    c = create_app(Bare(), REGISTRY).test_client()  # type: ignore[arg-type]
    assert c.post("/v1/sql", json={"sql": "SELECT 1"}).status_code == 404
    assert c.get("/v1/stores").status_code == 404


# --- /v1/stores --------------------------------------------------------------------------------


def test_stores(client: Any) -> None:
    resp = client.get("/v1/stores")
    assert resp.status_code == 200 and resp.get_json() == {"stores": [{"name": "scores", "type": "kv", "partitions": 8}]}
    assert client.get("/v1/stores/scores").get_json()["partitions"] == 8
    assert_error(client.get("/v1/stores/nope"), 404, "UNKNOWN_STORE", "'nope'")


@pytest.mark.parametrize("through", ["the fast path", "Flask's route"])
def test_key_lookup(node: FakeSqlNode, through: str) -> None:
    app = create_app(node, REGISTRY)
    if through == "Flask's route":
        app.wsgi_app = app.wsgi_app.app  # what SqlFastPath wraps
    client = app.test_client()
    resp = client.get("/v1/stores/scores/keys/alice")
    assert resp.status_code == 200 and resp.mimetype == "application/json"
    # The same value conventions as /v1/sql (a timestamp with its unit's digits), not Flask's RFC 822 dates.
    expected = {"player": "alice", "score": 120, "avatar": "iVBORw==", "rowtime": "2023-11-14T22:13:20.000Z"}
    assert resp.get_json() == expected
    # a key with slashes, answered as Arrow batches: the same object
    assert client.get("/v1/stores/scores/keys/a/b").get_json() == {**expected, "player": "a/b"}
    assert client.get("/v1/stores/scores/keys/日本/ü").get_json()["player"] == "日本/ü"
    err = assert_error(client.get("/v1/stores/scores/keys/zed"), 404, "KEY_NOT_FOUND", "'zed'", "'scores'")
    assert err["key"] == "zed"
    assert_error(client.get("/v1/stores/nope/keys/alice"), 404, "UNKNOWN_STORE")
    assert client.get("/v1/stores/scores/keys/").status_code == 404  # no key: no such route
    node.fail_with = SqlError("TIMEOUT", "the query ran past timeout_ms")
    node.lookup = lambda store, key: node.sql(SqlRequest("x"))  # type: ignore[method-assign]
    assert_error(client.get("/v1/stores/scores/keys/alice"), 504, "TIMEOUT")


# --- federator sql -------------------------------------------------------------------------------


def test_parse_param() -> None:
    assert [parse_param(v) for v in ["42", "-7", "+3", "1.5", "2e3", "-.5", "alice", "true", "null", "0x1f", "1_000",
                                     "", "nan", "inf", "1.2.3"]] == \
        [42, -7, 3, 1.5, 2000.0, -0.5, "alice", "true", "null", "0x1f", "1_000", "", "nan", "inf", "1.2.3"]


def test_format_table() -> None:
    cols = [{"name": "player", "type": "VARCHAR"}, {"name": "score", "type": "BIGINT"}, {"name": "ok", "type": "BOOLEAN"}]
    text = format_table(cols, [["日本", 5, True], ["a\nb", None, None], ["bob", 120, False]], {"elapsed_ms": 3.4})
    assert text.splitlines() == [
        "player  score  ok",
        "------  -----  -----",
        "日本        5  true",
        "a\\nb     NULL  NULL",
        "bob       120  false",
        "(3 rows, 3 ms)",
    ]
    assert format_table(cols, [["x", 1, True]], {}).splitlines()[-1] == "(1 row)"
    assert format_table([], [], {"elapsed_ms": 0}) == "(0 rows, 0 ms)"


@pytest.fixture
def server_url(node: FakeSqlNode) -> Iterator[str]:
    with running(create_app(node, REGISTRY)) as address:
        yield f"http://{address}"


def run(argv: list[str]) -> tuple[int, str, str, bytes]:
    out_bytes = io.BytesIO()
    out = io.TextIOWrapper(out_bytes, encoding="utf-8", write_through=True)
    err = io.StringIO()
    code = run_sql(build_parser().parse_args(["sql", *argv]), stdout=out, stderr=err)
    out.flush()
    return code, out_bytes.getvalue().decode("utf-8", "replace"), err.getvalue(), out_bytes.getvalue()


def test_cli_table_against_a_real_server(server_url: str, node: FakeSqlNode) -> None:
    code, out, err, _ = run(["--url", server_url, "--param", "alice", "--param", "3", "--param", "0.5",
                             "--token", "t0", "--allow-stale", "SELECT * FROM scores WHERE player = ?"])
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "player  score  rowtime",
        "------  -----  ------------------------",
        "alice     120  2023-11-14T22:13:20.000Z",
        "bob         7  2023-11-14T22:13:21.000Z",
        "日本     NULL  NULL",
        "(3 rows, 12 ms)",
    ]
    req = node.requests[0]
    assert (req.parameters, req.consistency_token, req.allow_stale) == (["alice", 3, 0.5], "t0", True)


def test_cli_raw_formats(server_url: str) -> None:
    code, out, _, _ = run(["--url", server_url + "/", "--format", "csv", "SELECT 1"])
    assert code == 0 and out.splitlines()[0] == '"player","score","rowtime"' and len(out.splitlines()) == 4
    code, out, _, _ = run(["--url", server_url, "--format", "json", "SELECT 1"])
    assert code == 0 and json.loads(out)["stats"]["rows"] == 3
    code, _, _, raw = run(["--url", server_url, "--format", "arrow", "SELECT 1"])
    assert code == 0 and pa.ipc.open_stream(raw).read_all().num_rows == 3


def test_cli_server_error(server_url: str, node: FakeSqlNode) -> None:
    node.fail_with = SqlError("SQL_PARSE_ERROR", "expected FROM, found FORM", line=1, col=10)
    code, out, err, _ = run(["--url", server_url, "SELECT * FORM scores"])
    assert (code, out) == (2, "")
    assert err.strip() == "error: SQL_PARSE_ERROR: expected FROM, found FORM (line 1, column 10)"


def test_cli_connection_refused_says_what_to_do(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    from tests.conftest import free_port

    url = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("FEDERATOR_URL", url)
    assert cli_main(["sql", "SELECT 1"]) == 2
    err = capsys.readouterr().err
    assert url in err and "federator node" in err and "federator demo" in err


class MidStreamFailure(FakeSqlNode):
    def __init__(self, rows_before: int = 1) -> None:
        self.rows_before = rows_before

    def sql(self, request: SqlRequest) -> SqlResult:
        def batches() -> Iterator[pa.RecordBatch]:
            yield pa.RecordBatch.from_pylist(ROWS[:1] * self.rows_before, schema=SCHEMA)
            raise SqlError("TIMEOUT", "partition 5 did not answer within 10000 ms", partitions=[5])

        return SqlResult(SCHEMA, batches(), "tok", {})


@pytest.mark.parametrize(("fmt", "message"), [("table", "error: TIMEOUT: partition 5"), ("csv", "cut off")])
def test_cli_failure_after_the_status_was_sent(fmt: str, message: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """JSON carries the error in the body; CSV cannot, so the server breaks off the chunked body.
    (The answer is large enough to be streaming when the failure comes, past the read-ahead.)"""
    from federator.sql import limits

    monkeypatch.setattr(limits, "READ_AHEAD_BYTES", 1)
    server = serve(create_app(MidStreamFailure(rows_before=5000), REGISTRY), "127.0.0.1", 0, threads=2)
    thread = start(server)
    try:
        code, _, err, _ = run(["--url", f"http://127.0.0.1:{bound_port(server)}", "--format", fmt, "SELECT 1"])
    finally:
        shutdown(server, thread)
    assert code == 2 and message in err, err


@pytest.mark.parametrize("fmt", ["csv", "arrow"])  # JSON and NDJSON carry errors in the body
def test_a_small_answer_that_fails_gets_the_real_status(fmt: str) -> None:
    """Small answers are sent whole, so a failure while building one still gets its status."""
    client = create_app(MidStreamFailure(), REGISTRY).test_client()
    resp = client.post("/v1/sql", json={"sql": "SELECT 1", "format": fmt})
    assert resp.status_code == 504 and resp.get_json()["error"]["code"] == "TIMEOUT"


def test_a_chunked_request_body_is_read_whole(server_url: str, node: FakeSqlNode) -> None:
    """Clients that stream their body (no Content-Length) are answered like any other."""
    import http.client
    from urllib.parse import urlsplit

    body = json.dumps({"sql": "SELECT * FROM scores WHERE player = ?", "parameters": ["alice"]}).encode()
    conn = http.client.HTTPConnection(urlsplit(server_url).netloc, timeout=10)
    conn.request("POST", "/v1/sql", body=iter([body[:10], body[10:]]),
                 headers={"Content-Type": "application/json"}, encode_chunked=True)
    resp = conn.getresponse()
    answer = resp.read()
    conn.close()
    assert resp.status == 200, answer
    assert json.loads(answer)["rows"][0][0] == "alice"
    assert node.requests[-1].parameters == ["alice"]


def test_a_refused_body_is_read_before_the_413_so_the_client_hears_it() -> None:
    """A server that answers a too-large body and closes while the client still sends makes the
    client see a reset instead of the 413: the body is read and dropped first, up to a bound."""
    from federator.http import sql_routes
    from federator.sql.limits import Limits

    body = io.BytesIO(b"x" * (70 * 1024))
    environ = {"CONTENT_LENGTH": str(70 * 1024), "wsgi.input": body}
    with pytest.raises(SqlError) as e:
        sql_routes._read_body(environ, Limits(max_body_bytes=64 * 1024))
    assert e.value.code == "REQUEST_TOO_LARGE" and body.tell() == 70 * 1024
    huge = io.BytesIO(b"x" * (sql_routes.DRAIN_MAX + 10))  # past the bound: not read to the end
    environ = {"CONTENT_LENGTH": str(sql_routes.DRAIN_MAX + 10), "wsgi.input": huge}
    with pytest.raises(SqlError):
        sql_routes._read_body(environ, Limits(max_body_bytes=64 * 1024))
    assert huge.tell() == sql_routes.DRAIN_MAX
