"""The node's HTTP app against a fake node: endpoints, status codes, error bodies, the secret, waitress."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pyarrow as pa
import pytest
from flask.testing import FlaskClient

from federator.http import bound_port, create_app, serve, shutdown, start
from federator.query import FailureReason, KeyQuery, Position, PositionBound, QueryResult, RangeQuery, StateQueryRequest
from federator.query.wire import MEDIA_TYPE, decode_results
from tests.registry import REGISTRY

SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64()), ("rowtime", pa.timestamp("ms", tz="UTC"))])
TOPIC = "app-s-changelog"


class FakeNode:
    """Answers every partition with the rows whose key the query names (or all rows)."""

    def __init__(self, secret: str | None = None) -> None:
        self.node_id = "node-a"
        self.state = "RUNNING"
        self.cluster_secret = secret
        self.requests: list[StateQueryRequest] = []
        self.is_ready: tuple[bool, list[str]] = (True, [])
        self.fail_with: Exception | None = None

    def execute(self, request: StateQueryRequest) -> list[QueryResult]:
        if self.fail_with is not None:
            raise self.fail_with
        self.requests.append(request)
        out = []
        for p in request.partitions or (0, 1):
            if p == 9:
                out.append(QueryResult.failed(p, FailureReason.NOT_PRESENT, "node-a does not host partition 9"))
                continue
            key = getattr(request.query, "key", f"k{p}")
            batch = pa.RecordBatch.from_pylist([{"k": key, "v": p, "rowtime": 1000}], schema=SCHEMA)
            out.append(QueryResult.success(p, batch, Position.of(TOPIC, p, 10 + p)))
        return out

    def schema_for(self, store: str) -> pa.Schema | None:
        return SCHEMA if store == "s" else None

    def metadata(self) -> dict:
        return {"nodes": [{"id": "node-a", "endpoint": "http://127.0.0.1:1"}], "stores": {"s": {"partitions": 2}}}

    def key_metadata(self, store: str, key: str) -> dict:
        if store != "s":
            raise KeyError(f"unknown store {store!r}; `federator store list` shows the stores")
        if key.startswith("!"):
            raise ValueError(f"key {key!r} is not a valid string key for store 's'")
        return {"store": store, "key": key, "partition": 1, "active": "node-a", "standbys": []}

    def ready(self) -> tuple[bool, list[str]]:
        return self.is_ready


@pytest.fixture
def node() -> FakeNode:
    return FakeNode()


@pytest.fixture
def client(node: FakeNode) -> FlaskClient:
    return create_app(node, REGISTRY).test_client()


def query_body(**kw: Any) -> dict:
    req = StateQueryRequest("s", KeyQuery("alice"), partitions=(0, 1), **kw)
    return req.to_dict()


def assert_error(resp: Any, status: int, code: str, *fragments: str) -> str:
    assert resp.status_code == status, resp.get_data(as_text=True)
    assert resp.mimetype == "application/json"
    body = resp.get_json()
    assert set(body) == {"error"} and body["error"]["code"] == code
    message = body["error"]["message"]
    for f in fragments:
        assert f in message
    return message


# --- public endpoints ---


def test_healthz(client: FlaskClient) -> None:
    resp = client.get("/healthz")
    assert resp.status_code == 200
    assert resp.get_json() == {"status": "up", "node_id": "node-a", "state": "RUNNING"}


def test_readyz_ready_and_not(client: FlaskClient, node: FakeNode) -> None:
    resp = client.get("/readyz")
    assert resp.status_code == 200 and resp.get_json()["ready"] is True
    node.is_ready = (False, ["partition s-1 is restoring (lag 120)"])
    resp = client.get("/readyz")
    assert resp.status_code == 503
    body = resp.get_json()
    assert body["ready"] is False and body["reasons"] == ["partition s-1 is restoring (lag 120)"]


def test_metadata(client: FlaskClient, node: FakeNode) -> None:
    resp = client.get("/v1/metadata")
    assert resp.status_code == 200 and resp.get_json() == node.metadata()


def test_key_metadata(client: FlaskClient) -> None:
    resp = client.get("/v1/metadata/stores/s/keys/a/b%20c")  # keys may hold slashes and escapes
    assert resp.status_code == 200
    assert resp.get_json()["key"] == "a/b c"


def test_key_metadata_unknown_store(client: FlaskClient) -> None:
    msg = assert_error(client.get("/v1/metadata/stores/nope/keys/x"), 404, "UNKNOWN_STORE", "'nope'")
    assert not msg.startswith('"')  # KeyError's quoting does not leak into the message


def test_key_metadata_invalid_key(client: FlaskClient) -> None:
    assert_error(client.get("/v1/metadata/stores/s/keys/!x"), 400, "INVALID_KEY", "'!x'")


def test_unknown_route_and_method_are_json(client: FlaskClient) -> None:
    assert_error(client.get("/v2/nothing"), 404, "NOT_FOUND", "/v2/nothing")
    assert_error(client.get("/internal/v1/query"), 405, "METHOD_NOT_ALLOWED", "POST")


def test_unexpected_exception_is_json_500(client: FlaskClient, node: FakeNode) -> None:
    node.fail_with = RuntimeError("rocksdb: IO error: disk full")
    resp = client.post("/internal/v1/query", json=query_body())
    assert_error(resp, 500, "INTERNAL", "RuntimeError", "disk full")


# --- the internal query call ---


def test_query_returns_arrow_stream(client: FlaskClient, node: FakeNode) -> None:
    sent = StateQueryRequest("s", KeyQuery("alice"), (0, 1, 9), PositionBound.at(Position.of(TOPIC, 0, 3)), True, True)
    resp = client.post("/internal/v1/query", json=sent.to_dict())
    assert resp.status_code == 200
    assert resp.headers["Content-Type"] == MEDIA_TYPE
    assert node.requests == [sent]
    results = decode_results(resp.get_data())
    assert [r.partition for r in results] == [0, 1, 9]
    assert results[0].ok and results[0].batch is not None
    assert results[0].batch.to_pylist()[0]["k"] == "alice"
    assert results[0].batch.schema.equals(SCHEMA)
    assert results[1].position == Position.of(TOPIC, 1, 11)
    assert results[2].failure is FailureReason.NOT_PRESENT


def test_query_unknown_store(client: FlaskClient, node: FakeNode) -> None:
    body = StateQueryRequest("nope", RangeQuery()).to_dict()
    assert_error(client.post("/internal/v1/query", json=body), 404, "UNKNOWN_STORE", "'nope'")
    assert node.requests == []


def test_unknown_query_type_fails_each_partition(client: FlaskClient, node: FakeNode) -> None:
    body = query_body()
    body["query"] = {"type": "NoSuchPluginQuery", "k": 3}
    body["partitions"] = [1, 3]
    resp = client.post("/internal/v1/query", json=body)
    assert resp.status_code == 200 and resp.headers["Content-Type"] == MEDIA_TYPE
    results = decode_results(resp.get_data())
    assert [r.partition for r in results] == [1, 3]
    assert all(r.failure is FailureReason.UNKNOWN_QUERY_TYPE and "NoSuchPluginQuery" in r.message for r in results)
    assert node.requests == []


def test_unknown_query_type_for_all_partitions_is_an_error(client: FlaskClient) -> None:
    body = query_body()
    body["query"] = {"type": "NoSuchPluginQuery", "k": 3}
    body["partitions"] = None
    assert_error(client.post("/internal/v1/query", json=body), 422, "UNKNOWN_QUERY_TYPE", "NoSuchPluginQuery")


@pytest.mark.parametrize(
    "data, fragment",
    [
        (b"", "empty"),
        (b"{not json", "not valid JSON"),
        (b"\xff\xfe\xfa", "not valid JSON"),
        (b"[1, 2]", "JSON object"),
        (json.dumps({"query": {"type": "KeyQuery", "key": "a"}}).encode(), "'store'"),
        (json.dumps({"store": "s"}).encode(), "'query'"),
        (json.dumps({"store": "s", "query": {"key": "a"}}).encode(), "'type'"),
        (json.dumps({"store": "s", "query": {"type": "KeyQuery"}}).encode(), "key"),
        (json.dumps({**query_body(), "partitions": ["zero"]}).encode(), "'partitions'"),
        (json.dumps({**query_body(), "bound": [1]}).encode(), "'bound'"),
        (json.dumps({**query_body(), "bound": {TOPIC: {"zero": 1}}}).encode(), "not a valid StateQueryRequest"),
        (json.dumps({"store": "s", "query": {"type": "X"}, "partitions": "0,1"}).encode(), "'partitions'"),
    ],
)
def test_bad_bodies(client: FlaskClient, node: FakeNode, data: bytes, fragment: str) -> None:
    resp = client.post("/internal/v1/query", data=data, content_type="application/json")
    assert_error(resp, 400, "BAD_REQUEST", fragment)
    assert node.requests == []


# --- the cluster secret ---


def test_secret_guards_internal_endpoints_only() -> None:
    node = FakeNode(secret="s3cret")
    client = create_app(node, REGISTRY).test_client()
    url = "/internal/v1/query"
    assert_error(client.post(url, json=query_body()), 403, "FORBIDDEN", "X-Federator-Secret", "cluster secret")
    wrong = {"X-Federator-Secret": "s3cre"}
    assert_error(client.post(url, json=query_body(), headers=wrong), 403, "FORBIDDEN", "cluster secret")
    ok = client.post(url, json=query_body(), headers={"X-Federator-Secret": "s3cret"})
    assert ok.status_code == 200 and len(decode_results(ok.get_data())) == 2
    # Unknown internal routes do not reveal themselves without the secret.
    assert_error(client.get("/internal/v1/anything"), 403, "FORBIDDEN")
    for public in ("/healthz", "/readyz", "/v1/metadata", "/v1/metadata/stores/s/keys/a"):
        assert client.get(public).status_code == 200


def test_no_secret_means_no_header_needed(client: FlaskClient) -> None:
    assert client.post("/internal/v1/query", json=query_body()).status_code == 200


# --- served for real ---


def test_served_by_waitress_over_real_http() -> None:
    node = FakeNode(secret="s3cret")
    server = serve(create_app(node, REGISTRY), "127.0.0.1", 0, threads=2)
    thread = start(server)
    try:
        base = f"http://127.0.0.1:{bound_port(server)}"
        with urllib.request.urlopen(f"{base}/healthz", timeout=10) as resp:
            assert resp.status == 200 and json.load(resp)["node_id"] == "node-a"
        req = urllib.request.Request(
            f"{base}/internal/v1/query",
            data=json.dumps(query_body()).encode(),
            headers={"Content-Type": "application/json", "X-Federator-Secret": "s3cret"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.headers["Content-Type"] == MEDIA_TYPE
            assert [r.partition for r in decode_results(resp.read())] == [0, 1]
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"{base}/nope", timeout=10)
        assert e.value.code == 404 and json.load(e.value)["error"]["code"] == "NOT_FOUND"
    finally:
        shutdown(server, thread)
    assert not thread.is_alive()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{base}/healthz", timeout=2)


def test_stop_a_server_that_never_ran() -> None:
    server = serve(create_app(FakeNode(), REGISTRY), "127.0.0.1", 0)
    port = bound_port(server)
    shutdown(server)
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2)


def test_shutdown_ends_a_loop_run_in_the_callers_own_thread(monkeypatch) -> None:
    """shutdown, not told of the thread, hands the closing to the running loop (its trigger),
    which ends it; the grace path, closing the sockets from the caller's thread after a wait,
    is for a loop that is not running."""
    import threading

    from waitress import wasyncore

    closed_in: list[str] = []
    close_all = wasyncore.close_all

    def spy(*args, **kwargs):
        closed_in.append(threading.current_thread().name)
        return close_all(*args, **kwargs)

    monkeypatch.setattr(wasyncore, "close_all", spy)
    server = serve(create_app(FakeNode(), REGISTRY), "127.0.0.1", 0)
    port = bound_port(server)
    thread = threading.Thread(target=server.run, name="the loop", daemon=True)  # as `federator node` runs it
    thread.start()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as resp:
        assert resp.status == 200
    shutdown(server)
    thread.join(10)
    assert not thread.is_alive()
    assert closed_in == ["the loop"]  # handed to the loop, not the grace path
