"""The point lookup's node-to-node call: the owner's end (InternalKeyPath) over a real
waitress server, the caller's end (NodeClient.read_key), and the dispatcher choosing it."""

from __future__ import annotations

import json
from typing import Any, Iterator

import pytest
from werkzeug.test import Client

from federator.dispatch.client import NodeClient
from federator.http.internal_key import InternalKeyPath
from federator.query.position import Position, PositionBound
from federator.query.wire import key_path, parse_key_path
from federator.store.layer import StoredEntry
from tests.http_server import running

TOPIC = "app-s-changelog"


class FakeDefinition:
    topic = TOPIC


class FakeOwner:
    """Holds partition 3 of store "s" as its active copy at offset 41."""

    cluster_secret: str | None = None

    def __init__(self) -> None:
        self.stores = {"s": FakeDefinition()}
        self.data = {b"k\x00\xff": b"stored-bytes", b"": b"empty key"}
        self.asked: list[tuple[str, int, bytes, PositionBound]] = []

    def read_local(self, store: str, partition: int, key: bytes, bound: PositionBound) -> StoredEntry | None:
        self.asked.append((store, partition, key, bound))
        at = Position.of(TOPIC, 3, 41)
        if partition != 3 or not bound.is_satisfied_by(at, TOPIC, partition):
            return None
        return StoredEntry(self.data.get(key), at)


def fallback(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    start_response("404 Not Found", [("Content-Type", "application/json")])
    return [json.dumps({"error": {"code": "NOT_FOUND", "path": environ["PATH_INFO"]}}).encode()]


@pytest.fixture
def owner() -> FakeOwner:
    return FakeOwner()


@pytest.fixture
def http_owner(owner: FakeOwner) -> Iterator[str]:
    with running(InternalKeyPath(fallback, owner)) as address:
        yield address


@pytest.mark.parametrize("key", [b"k\x00\xff", b"", b"\xfb\xff" * 40])
def test_a_key_path_names_any_key_bytes(key: bytes) -> None:
    assert parse_key_path(key_path("s", 3, key)) == ("s", 3, key)


def test_the_owner_answers_stored_bytes_absence_or_that_it_cannot(owner: FakeOwner) -> None:
    c = Client(InternalKeyPath(fallback, owner))
    r = c.get(key_path("s", 3, b"k\x00\xff"))
    assert (r.status_code, r.data, r.headers["X-Federator-Offset"]) == (200, b"stored-bytes", "41")
    r = c.get(key_path("s", 3, b"nope"))
    assert (r.status_code, r.data, r.headers["X-Federator-Offset"]) == (204, b"", "41")
    assert c.get(key_path("s", 5, b"k")).status_code == 409  # not a partition it holds so
    assert c.get(key_path("s", 3, b"k\x00\xff") + "?at=41").status_code == 200
    assert c.get(key_path("s", 3, b"k\x00\xff") + "?at=42").status_code == 409  # behind the token
    assert owner.asked[-1][3] == PositionBound.at(Position.of(TOPIC, 3, 42))
    # not a key call: the app behind answers (it names what there is)
    for path in (key_path("nosuch", 3, b"k"), "/internal/v1/key/s/x/a2V5", "/internal/v1/key/s/3/!!!"):
        assert c.get(path).status_code == 404, path
    assert c.post(key_path("s", 3, b"k")).status_code == 404


def test_without_the_cluster_secret_the_owner_reads_nothing(owner: FakeOwner) -> None:
    owner.cluster_secret = "s3cret"
    c = Client(InternalKeyPath(fallback, owner))
    assert c.get(key_path("s", 3, b"k\x00\xff")).status_code == 404  # the app's guard answers it
    assert c.get(key_path("s", 3, b"k\x00\xff"), headers={"X-Federator-Secret": "wrong"}).status_code == 404
    assert owner.asked == []
    r = c.get(key_path("s", 3, b"k\x00\xff"), headers={"X-Federator-Secret": "s3cret"})
    assert (r.status_code, r.data) == (200, b"stored-bytes")


def test_the_client_reads_entries_over_one_kept_connection(http_owner: str, owner: FakeOwner) -> None:
    client = NodeClient(http_owner)
    assert client.read_key("s", TOPIC, 3, b"k\x00\xff", None, 5) == StoredEntry(b"stored-bytes", Position.of(TOPIC, 3, 41))
    conn = client._local.conn
    assert client.read_key("s", TOPIC, 3, b"", None, 5) == StoredEntry(b"empty key", Position.of(TOPIC, 3, 41))
    assert client.read_key("s", TOPIC, 3, b"nope", None, 5) == StoredEntry(None, Position.of(TOPIC, 3, 41))
    assert client._local.conn is conn  # kept alive
    assert client.read_key("s", TOPIC, 5, b"k", None, 5) is None  # cannot: the caller goes the general way
    assert client.read_key("s", TOPIC, 3, b"k\x00\xff", 99, 5) is None
    conn.sock.close()  # the server's side of a kept connection went away: one new connection
    assert client.read_key("s", TOPIC, 3, b"k\x00\xff", 41, 5) == StoredEntry(b"stored-bytes", Position.of(TOPIC, 3, 41))


def test_the_client_sends_the_secret_and_a_gone_node_is_no_answer(http_owner: str, owner: FakeOwner) -> None:
    owner.cluster_secret = "s3cret"
    assert NodeClient(http_owner).read_key("s", TOPIC, 3, b"k\x00\xff", None, 5) is None
    assert NodeClient(http_owner, "s3cret").read_key("s", TOPIC, 3, b"k\x00\xff", None, 5).stored == b"stored-bytes"
    assert NodeClient("127.0.0.1:1").read_key("s", TOPIC, 3, b"k", None, 5) is None
