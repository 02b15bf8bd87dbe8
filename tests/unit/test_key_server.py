"""The point lookup's node-to-node call over real sockets: the node's KeyServer and the
caller's KeyClient (a thread's) and AsyncKeyClient (an event loop's), and the framing between
them."""

from __future__ import annotations

import asyncio
import io
import json
import socket
import threading
import time
from typing import Any, Awaitable, Callable, Iterator

import pyarrow as pa
import pytest
import uvloop

from federator.dispatch.client import NodeCallError
from federator.dispatch.key_client import CallClient, CallUnavailable, KeyClient
from federator.dispatch.key_client_async import AsyncKeyClient
from federator.node.key_server import KeyServer
from federator.query.position import Position, PositionBound
from federator.query import wire
from federator.query.queries import RangeQuery
from federator.query.request import StateQueryRequest
from federator.query.result import QueryResult
from federator.store.layer import StoredEntry
from federator.tls import Tls

TOPIC = "app-s-changelog"
AT = Position.of(TOPIC, 3, 41)


class Owner:
    """Holds partition 3 of store "s" as its active copy at offset 41."""

    def __init__(self) -> None:
        self.data = {b"k\x00\xff": b"stored-bytes", b"": b"empty key", b"big": bytes(range(256)) * 4000}
        self.asked: list[tuple[str, int, bytes, PositionBound]] = []
        self.fail = False

    def read_local(self, store: str, partition: int, key: bytes, bound: PositionBound) -> StoredEntry | None:
        self.asked.append((store, partition, key, bound))
        if self.fail:
            raise RuntimeError("the shard broke")
        if partition != 3 or not bound.is_satisfied_by(AT, TOPIC, partition):
            return None
        return StoredEntry(self.data.get(key), AT)

    @staticmethod
    def topic_of(store: str) -> str | None:
        return TOPIC if store == "s" else None


@pytest.fixture
def owner() -> Owner:
    return Owner()


def serving(owner: Owner, secret: str | None = None) -> KeyServer:
    server = KeyServer(owner.read_local, owner.topic_of, secret, "127.0.0.1", 0)
    server.start()
    return server


@pytest.fixture
def server(owner: Owner) -> Iterator[KeyServer]:
    s = serving(owner)
    yield s
    s.stop()


def endpoint(server: KeyServer) -> str:
    return f"127.0.0.1:{server.port}"


@pytest.mark.parametrize("key, at", [(b"k\x00\xff", None), (b"", 0), (bytes(70_000), 2**40)])
def test_a_request_and_an_answer_read_back_as_sent(key: bytes, at: int | None) -> None:
    request = wire.key_request("s", 3, key, at)
    assert wire.split_key_request(request + b"next") == (("s", 3, key, at), len(request))
    assert wire.split_key_request(request[:-1]) is None  # not all of it there yet
    for answer in ((wire.KEY_FOUND, 41, key), (wire.KEY_ABSENT, 41, None), (wire.KEY_CANNOT, None, None)):
        assert wire.read_key_answer(wire.exact_reader(io.BytesIO(wire.key_answer(*answer)))) == answer
    with pytest.raises(EOFError):
        wire.read_key_answer(wire.exact_reader(io.BytesIO(wire.key_answer(wire.KEY_FOUND, 1, key)[:-1] if key else b"")))


def test_the_node_answers_stored_bytes_absence_or_that_it_cannot(server: KeyServer, owner: Owner) -> None:
    client = KeyClient(endpoint(server))
    assert client.read_key("s", TOPIC, 3, b"k\x00\xff", None, 5) == StoredEntry(b"stored-bytes", AT)
    assert client.read_key("s", TOPIC, 3, b"", None, 5) == StoredEntry(b"empty key", AT)
    assert client.read_key("s", TOPIC, 3, b"big", None, 5) == StoredEntry(owner.data[b"big"], AT)
    assert client.read_key("s", TOPIC, 3, b"nope", None, 5) == StoredEntry(None, AT)
    assert client.read_key("s", TOPIC, 5, b"k", None, 5) is None  # not a partition it holds so
    assert client.read_key("other", TOPIC, 3, b"k", None, 5) is None  # not a store it knows
    assert client.read_key("s", TOPIC, 3, b"k\x00\xff", 41, 5) == StoredEntry(b"stored-bytes", AT)
    assert client.read_key("s", TOPIC, 3, b"k\x00\xff", 42, 5) is None  # behind the token
    assert owner.asked[-1][3] == PositionBound.at(Position.of(TOPIC, 3, 42))
    owner.fail = True
    assert client.read_key("s", TOPIC, 3, b"k\x00\xff", None, 5) is None  # a failed read: the general path says why
    owner.fail = False
    assert client.read_key("s", TOPIC, 3, b"k\x00\xff", None, 5) == StoredEntry(b"stored-bytes", AT)


def test_each_calling_thread_keeps_one_connection(server: KeyServer) -> None:
    client = KeyClient(endpoint(server))
    client.read_key("s", TOPIC, 3, b"", None, 5)
    held = client._local.held
    client.read_key("s", TOPIC, 3, b"", None, 5)
    assert client._local.held is held
    other: list = []
    t = threading.Thread(target=lambda: other.append((client.read_key("s", TOPIC, 3, b"", None, 5), client._local.held)))
    t.start()
    t.join()
    assert other[0][0] == StoredEntry(b"empty key", AT) and other[0][1] is not held


def test_a_connection_the_node_dropped_is_opened_again(owner: Owner) -> None:
    first = serving(owner)
    client = KeyClient(endpoint(first))
    assert client.read_key("s", TOPIC, 3, b"", None, 5) is not None
    first.stop()  # ends every connection
    assert client.read_key("s", TOPIC, 3, b"", None, 5) is None  # nobody there: the general path
    again = KeyServer(owner.read_local, owner.topic_of, None, "127.0.0.1", first.port)
    again.start()
    try:
        assert client.read_key("s", TOPIC, 3, b"", None, 5) == StoredEntry(b"empty key", AT)
    finally:
        again.stop()


def test_only_callers_with_the_cluster_secret_are_answered(owner: Owner) -> None:
    server = serving(owner, "s3cret")
    try:
        assert KeyClient(endpoint(server)).read_key("s", TOPIC, 3, b"", None, 5) is None
        assert KeyClient(endpoint(server), "wrong").read_key("s", TOPIC, 3, b"", None, 5) is None
        assert owner.asked == []
        assert KeyClient(endpoint(server), "s3cret").read_key("s", TOPIC, 3, b"", None, 5) == StoredEntry(b"empty key", AT)
    finally:
        server.stop()


def test_a_node_that_is_not_there_is_no_answer() -> None:
    assert KeyClient("127.0.0.1:1").read_key("s", TOPIC, 3, b"k", None, 5) is None


# ---- the per-partition query's call on the same port ------------------------------------------
def call_server(answer, secret: str | None = None) -> KeyServer:
    owner = Owner()
    server = KeyServer(owner.read_local, owner.topic_of, secret, "127.0.0.1", 0, answer_call=answer)
    server.start()
    return server


def test_a_query_call_is_answered_with_the_result_stream_on_a_kept_connection() -> None:
    seen: list[dict] = []

    def answer(raw: bytes) -> tuple[int, bytes]:
        body = json.loads(raw)
        seen.append(body)
        results = [QueryResult.success(p, pa.record_batch({"p": [p]}), Position.of(TOPIC, p, 7)) for p in body["partitions"]]
        return 200, wire.encode_results(results, pa.schema([("p", pa.int64())]))

    server = call_server(answer, secret="s3")
    try:
        client = CallClient(f"127.0.0.1:{server.port}", "s3")
        for parts in ((0, 1), (2,)):
            got = client.query(StateQueryRequest("s", RangeQuery(), parts), timeout=5)
            assert [(r.partition, r.batch.to_pylist(), r.position.get(TOPIC, r.partition)) for r in got] == [
                (p, [{"p": p}], 7) for p in parts]
        assert [b["partitions"] for b in seen] == [[0, 1], [2]]
        assert len(server._connections) == 1  # one connection for the thread's calls
    finally:
        server.stop()


def test_a_query_call_error_and_a_refused_port_are_told_apart() -> None:
    server = call_server(lambda raw: (404, b'{"error": {"code": "UNKNOWN_STORE", "message": "unknown store \'s\'"}}'),
                         secret="right")
    req = StateQueryRequest("s", RangeQuery(), (0,))
    try:
        with pytest.raises(NodeCallError) as e:
            CallClient(f"127.0.0.1:{server.port}", "right").query(req, timeout=5)
        assert e.value.status == 404 and e.value.code == "UNKNOWN_STORE"
        with pytest.raises(CallUnavailable):  # the wrong secret: the port closes, the caller goes to HTTP
            CallClient(f"127.0.0.1:{server.port}", "wrong").query(req, timeout=5)
    finally:
        server.stop()
    no_calls = KeyServer(Owner().read_local, Owner.topic_of, None, "127.0.0.1", 0)  # a node that takes no calls
    no_calls.start()
    try:
        with pytest.raises(CallUnavailable):
            CallClient(f"127.0.0.1:{no_calls.port}").query(req, timeout=5)
    finally:
        no_calls.stop()


def test_calls_sent_to_several_nodes_are_read_after_and_an_abandoned_one_is_not_read_as_the_next() -> None:
    """A caller sends its calls to every node, does its own part, then reads the answers; an
    answer it gives up on (its own part failed) must not be read as its next call's."""
    def answering(name: str):
        def answer(raw: bytes) -> tuple[int, bytes]:
            body = json.loads(raw)
            results = [QueryResult.success(p, pa.record_batch({"node": [name]}), Position.of(TOPIC, p, 1))
                       for p in body["partitions"]]
            return 200, wire.encode_results(results, pa.schema([("node", pa.string())]))
        return answer

    servers = [call_server(answering("n1")), call_server(answering("n2"))]
    try:
        n1, n2 = (CallClient(f"127.0.0.1:{s.port}") for s in servers)
        first, second = n1.send(StateQueryRequest("s", RangeQuery(), (0,)), 5), \
            n2.send(StateQueryRequest("s", RangeQuery(), (1,)), 5)
        assert [r.batch.to_pylist() for r in second()] == [[{"node": "n2"}]]
        assert [(r.partition, r.batch.to_pylist()) for r in first()] == [(0, [{"node": "n1"}])]
        abandoned = n1.send(StateQueryRequest("s", RangeQuery(), (5,)), 5)
        abandoned.abandon()
        got = n1.query(StateQueryRequest("s", RangeQuery(), (6,)), 5)
        assert [r.partition for r in got] == [6]  # not partition 5's answer
        first.abandon()  # already read: nothing to drop, the connection stays
        assert [r.partition for r in n1.query(StateQueryRequest("s", RangeQuery(), (7,)), 5)] == [7]
    finally:
        for s in servers:
            s.stop()


# ---- the event loop's client of the port (the loop server's routed point reads) ---------------
def on_loop(make: Callable[[], Awaitable[Any]]) -> Any:
    """``make()`` awaited on a uvloop event loop, as the loop server runs."""
    return uvloop.run(make())


def test_the_loops_client_answers_as_the_threads_client(server: KeyServer, owner: Owner) -> None:
    async def reads() -> list:
        client = AsyncKeyClient(endpoint(server))
        out = [await client.read_key("s", TOPIC, 3, key, at, 5)
               for key, at in ((b"k\x00\xff", None), (b"", None), (b"big", None), (b"nope", None), (b"k\x00\xff", 41))]
        out += [await client.read_key("s", TOPIC, 5, b"k", None, 5),  # not a partition it holds so
                await client.read_key("other", TOPIC, 3, b"k", None, 5),  # not a store it knows
                await client.read_key("s", TOPIC, 3, b"k\x00\xff", 42, 5)]  # behind the token
        owner.fail = True
        out.append(await client.read_key("s", TOPIC, 3, b"k\x00\xff", None, 5))
        owner.fail = False
        out.append(await client.read_key("s", TOPIC, 3, b"", None, 5))
        return out

    assert on_loop(reads) == [StoredEntry(b"stored-bytes", AT), StoredEntry(b"empty key", AT),
                              StoredEntry(owner.data[b"big"], AT), StoredEntry(None, AT),
                              StoredEntry(b"stored-bytes", AT), None, None, None, None, StoredEntry(b"empty key", AT)]
    assert owner.asked[6][3] == PositionBound.at(Position.of(TOPIC, 3, 42))
    assert len(owner.asked) == 9  # each asked once (but of the store it does not know), on one connection
    assert len(server._connections) <= 1


def test_the_loops_concurrent_requests_share_one_connection_each_answered_its_own(owner: Owner) -> None:
    slow = threading.Event()
    read = owner.read_local
    keys = [b"k\x00\xff", b"", b"big", b"nope"] * 2

    def held(*args: Any) -> StoredEntry | None:
        slow.wait(5)  # the first read waits until all have been sent
        return read(*args)

    owner.read_local = held  # type: ignore[method-assign]
    server = serving(owner)

    async def many() -> tuple[list, int, int]:
        client = AsyncKeyClient(endpoint(server))
        tasks = [asyncio.ensure_future(client.read_key("s", TOPIC, 3, key, None, 5)) for key in keys]
        await asyncio.sleep(0.3)
        opened = len(server._connections)
        slow.set()
        got = await asyncio.gather(*tasks)
        await client.read_key("s", TOPIC, 3, b"", None, 5)
        return got, opened, len(server._connections)

    try:
        got, opened, after = on_loop(many)
    finally:
        server.stop()
    by_key = {b"k\x00\xff": StoredEntry(b"stored-bytes", AT), b"": StoredEntry(b"empty key", AT),
              b"big": StoredEntry(owner.data[b"big"], AT), b"nope": StoredEntry(None, AT)}
    assert got == [by_key[k] for k in keys]  # in the order asked, each its own key's
    assert opened == 1 and after == 1  # all eight sent on one connection, kept for the next


def test_the_node_answers_requests_sent_before_any_answer_in_their_order(server: KeyServer) -> None:
    keys = [b"k\x00\xff", b"", b"big", b"nope"]
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(wire.key_hello(None))
        assert sock.recv(1) == wire.KEY_WELCOME
        sock.sendall(b"".join(wire.key_request("s", 3, k, None) for k in keys))  # before any answer
        read = wire.exact_reader(sock.makefile("rb"))
        answers = [wire.read_key_answer(read) for _ in keys]
    assert [a[0] for a in answers] == [wire.KEY_FOUND, wire.KEY_FOUND, wire.KEY_FOUND, wire.KEY_ABSENT]
    assert answers[0][2] == b"stored-bytes" and answers[1][2] == b"empty key"


def test_the_loops_client_opens_a_connection_the_node_dropped_again(owner: Owner) -> None:
    first = serving(owner)

    async def reads() -> list:
        client = AsyncKeyClient(endpoint(first))
        out = [await client.read_key("s", TOPIC, 3, b"", None, 5)]
        first.stop()  # ends every connection
        out.append(await client.read_key("s", TOPIC, 3, b"", None, 5))  # nobody there: the general path
        again = KeyServer(owner.read_local, owner.topic_of, None, "127.0.0.1", first.port)
        again.start()
        try:
            out.append(await client.read_key("s", TOPIC, 3, b"", None, 5))
            again.stop()
            restarted = KeyServer(owner.read_local, owner.topic_of, None, "127.0.0.1", first.port)
            restarted.start()
            try:  # the kept connection is closed: the request goes again on a new one
                out.append(await client.read_key("s", TOPIC, 3, b"", None, 5))
            finally:
                restarted.stop()
        finally:
            again.stop()
        return out

    assert on_loop(reads) == [StoredEntry(b"empty key", AT), None, StoredEntry(b"empty key", AT),
                              StoredEntry(b"empty key", AT)]


def test_the_loops_client_gives_up_at_its_timeout_and_reads_no_late_answer_as_the_next(owner: Owner) -> None:
    read = owner.read_local
    delays = {b"late": 0.6}

    def slow(store: str, partition: int, key: bytes, bound: PositionBound) -> StoredEntry | None:
        time.sleep(delays.get(key, 0))
        return read(store, partition, key, bound)

    owner.read_local = slow  # type: ignore[method-assign]
    server = serving(owner)

    async def reads() -> tuple[StoredEntry | None, float, StoredEntry | None]:
        client = AsyncKeyClient(endpoint(server))
        started = time.monotonic()
        late = await client.read_key("s", TOPIC, 3, b"late", None, 0.2)
        took = time.monotonic() - started
        return late, took, await client.read_key("s", TOPIC, 3, b"k\x00\xff", None, 5)

    try:
        late, took, next_one = on_loop(reads)
    finally:
        server.stop()
    assert late is None and took < 0.5
    assert next_one == StoredEntry(b"stored-bytes", AT)  # its own answer, not the late one's


def test_a_read_with_a_sooner_deadline_behind_a_slow_one_gives_up_at_its_own(owner: Owner) -> None:
    """Answers come in order: a read queued behind a slow one still gives up at its own,
    sooner, deadline, and the slow one gets its answer."""
    read = owner.read_local

    def slow(store: str, partition: int, key: bytes, bound: PositionBound) -> StoredEntry | None:
        time.sleep(0.6 if key == b"slow" else 0)
        return read(store, partition, key, bound)

    owner.read_local = slow  # type: ignore[method-assign]
    server = serving(owner)

    async def reads() -> tuple[StoredEntry | None, StoredEntry | None, float]:
        client = AsyncKeyClient(endpoint(server))
        started = time.monotonic()
        first = asyncio.ensure_future(client.read_key("s", TOPIC, 3, b"slow", None, 5))
        await asyncio.sleep(0)  # the slow read asked first
        second = await client.read_key("s", TOPIC, 3, b"k\x00\xff", None, 0.2)
        return await first, second, time.monotonic() - started

    try:
        first, second, took = on_loop(reads)
    finally:
        server.stop()
    assert first == StoredEntry(None, AT) and second is None and took >= 0.5  # (no such key: absent)


def test_the_loops_client_needs_the_secret_and_a_node_that_is_there(owner: Owner, tmp_path) -> None:
    server = serving(owner, "s3cret")

    async def reads() -> list:
        return [await AsyncKeyClient(endpoint(server)).read_key("s", TOPIC, 3, b"", None, 5),
                await AsyncKeyClient(endpoint(server), "wrong").read_key("s", TOPIC, 3, b"", None, 5),
                await AsyncKeyClient("127.0.0.1:1").read_key("s", TOPIC, 3, b"", None, 5),
                await AsyncKeyClient(endpoint(server), "s3cret").read_key("s", TOPIC, 3, b"", None, 5)]

    try:
        assert on_loop(reads) == [None, None, None, StoredEntry(b"empty key", AT)]
    finally:
        server.stop()


def test_the_loops_client_speaks_tls_and_checks_the_nodes_certificate(owner: Owner, tmp_path) -> None:
    from tests.certificates import make_certificate

    tls = Tls(*make_certificate(tmp_path))
    stranger = Tls(*make_certificate(tmp_path, "other"))  # trusts only its own certificate
    server = KeyServer(owner.read_local, owner.topic_of, "s", "127.0.0.1", 0, tls)
    server.start()

    async def reads() -> list:
        return [await AsyncKeyClient(endpoint(server), "s", tls).read_key("s", TOPIC, 3, b"", None, 5),
                await AsyncKeyClient(endpoint(server), "s", stranger).read_key("s", TOPIC, 3, b"", None, 5),
                await AsyncKeyClient(endpoint(server), "s").read_key("s", TOPIC, 3, b"", None, 2)]

    try:
        assert on_loop(reads) == [StoredEntry(b"empty key", AT), None, None]
    finally:
        server.stop()
