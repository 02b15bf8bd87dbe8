"""The dispatcher's retries, backoff and fallbacks, against small fakes: a routing view the test
changes as heartbeats would, nodes that answer from a script, and a clock that only moves when
the dispatcher sleeps (so a deadline is reached in no real time, and the backoff is observed
as the sleeps it asked for, not measured).

What must hold: NOT_PRESENT, NOT_ACTIVE, NOT_UP_TO_BOUND, DOES_NOT_EXIST and a node that does
not answer make the dispatcher read the view again and retry, with backoff, until the deadline;
then the query fails naming exactly the partitions that did not answer (never a partial answer).
``allow_stale`` falls back to a standby within ``max_lag``, and to no standby beyond it.
"""

from __future__ import annotations

import time
from typing import Callable

import pyarrow as pa
import pytest

from federator.dispatch import NodeCallError
from federator.dispatch import dispatcher as dispatcher_module
from federator.dispatch.dispatcher import Dispatcher
from federator.dispatch.key_client import CallUnavailable
from federator.cluster.membership import ClusterView, NodeInfo
from federator.plan.keys import SubQuery
from federator.query import KeyQuery, Position, PositionBound, RangeQuery, StateQueryRequest
from federator.query.result import FailureReason, QueryResult
from federator.route.read_options import ReadOptions
from federator.store.layer import StoredEntry
from federator.dispatch.errors import DispatchError
from federator.errors import SqlError
from federator.sql.dispatch_errors import from_dispatch
from tests.unit import fake_node

TOPIC = "app-s-changelog"
RETRYABLE = [FailureReason.NOT_PRESENT, FailureReason.NOT_ACTIVE, FailureReason.NOT_UP_TO_BOUND,
             FailureReason.DOES_NOT_EXIST]
UNREACHABLE = "unreachable"  # a scripted answer: the call raises NodeCallError (connection refused)


class Clock:
    """Stands in for the dispatcher's ``time``: monotonic() moves only by the sleeps asked for.
    ``on_sleep`` runs after each sleep: what the test lets happen meanwhile (heartbeats)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []
        self.on_sleep: Callable[[int], None] = lambda n: None

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        self.on_sleep(len(self.sleeps))


def info(node_id: str, active: list[int] = (), standby: list[int] = (), lags: dict[int, int] | None = None,
         key_port: bool = True) -> NodeInfo:
    return NodeInfo(node_id, f"{node_id}:1", "RUNNING", {"s": list(active)} if active else {},
                    {"s": list(standby)} if standby else {}, lags={"s": lags or {}},
                    timestamp_ms=int(time.time() * 1000), key_endpoint=f"{node_id}:2" if key_port else None)


class World:
    """The cluster as the dispatcher on node ``me`` sees it: a view, and what each node answers.

    ``script[node]`` is a list of answers, one per call, the last repeated: a FailureReason
    (every partition of the call fails so), UNREACHABLE, "ok" (each partition answers one
    row naming the node), or a function run while the node holds the call, returning one."""

    def __init__(self, *nodes: NodeInfo) -> None:
        self.view = ClusterView()
        for n in nodes:
            self.view.update_local(n)
        self.script: dict[str, list] = {}
        self.calls: list[tuple[str, tuple[int, ...], bool]] = []  # (node, partitions, require_active)

    def move(self, *nodes: NodeInfo) -> None:
        """New heartbeats: these nodes now host what they say."""
        for n in nodes:
            self.view.update_local(n)

    def answer(self, node: str, req: StateQueryRequest) -> list[QueryResult]:
        self.calls.append((node, tuple(req.partitions), req.require_active))
        seen = sum(1 for c in self.calls if c[0] == node)
        script = self.script.get(node, ["ok"])
        what = script[min(seen, len(script)) - 1]
        if callable(what):  # what happens while the node holds the call, then its answer
            what = what()
        if what == UNREACHABLE:
            raise NodeCallError(f"{node}:1", "no answer (NewConnectionError: connection refused)")
        out = []
        for p in req.partitions:
            if what == "ok":
                out.append(QueryResult.success(p, pa.record_batch({"node": [node], "p": [p]}), Position.of(TOPIC, p, 5)))
            elif isinstance(what, FailureReason):
                out.append(QueryResult.failed(p, what, f"scripted {what.value}"))
            else:
                out.append(QueryResult.failed(p, FailureReason.STORE_EXCEPTION, "scripted", code=what))
        return out


class FakeNode(fake_node.FakeNode):
    """What the dispatcher reads of its node: id, view, store definitions, in-process execution."""

    def __init__(self, world: World, node_id: str = "me") -> None:
        super().__init__(world.view, {"s": type("Defn", (), {"topic": TOPIC, "partitions": 4, "is_global": False})()})
        self.node_id, self.world = node_id, world
        self.endpoint = f"{node_id}:1"
        self.lags: dict[int, int | None] = {}  # partition -> its own copy's lag (a global store's)
        self.waits: list[tuple[str, dict[int, int]]] = []  # wait_applied's calls

    def execute(self, req: StateQueryRequest) -> list[QueryResult]:
        return self.world.answer(self.node_id, req)

    def local_lag(self, store: str, partition: int) -> int | None:
        return self.lags.get(partition, 0)

    def wait_applied(self, store: str, offsets: dict[int, int], deadline: float) -> None:
        self.waits.append((store, dict(offsets)))


class FakeClient:
    def __init__(self, world: World, endpoint: str) -> None:
        self.world, self.node = world, endpoint.split(":")[0]

    def query(self, req: StateQueryRequest, timeout: float) -> list[QueryResult]:
        assert timeout > 0
        return self.world.answer(self.node, req)

    def send(self, req: StateQueryRequest, timeout: float) -> FakePending:
        """As the key port's client: the call goes now, the answer is read later."""
        assert timeout > 0
        return FakePending(lambda: self.world.answer(self.node, req))


class FakePending:
    def __init__(self, read) -> None:
        self.read, self.abandoned = read, False

    def __call__(self) -> list[QueryResult]:
        return self.read()

    def abandon(self) -> None:
        self.abandoned = True


@pytest.fixture
def clock(monkeypatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(dispatcher_module, "time", c)
    return c


@pytest.fixture
def make(monkeypatch):
    made: list[Dispatcher] = []

    def build(world: World, node_id: str = "me") -> Dispatcher:
        d = Dispatcher(FakeNode(world, node_id), max_workers=4)
        monkeypatch.setattr(d, "_client", lambda endpoint: FakeClient(world, endpoint))
        monkeypatch.setattr(d, "_call_client", lambda endpoint: FakeClient(world, endpoint))  # the key port
        made.append(d)
        return d

    yield build
    for d in made:
        d.pool.shutdown()


def gather(d: Dispatcher, clock: Clock, partitions: tuple[int, ...] = (0,), *, allow_stale: bool = False,
           max_lag: int | None = None, timeout: float = 2.0, bound: PositionBound | None = None):
    """The dispatcher's answer, its errors as the user gets them (the SQL layer's mapping)."""
    try:
        return d.gather("s", 4, [SubQuery(KeyQuery("k"), partitions)], None,
                        ReadOptions(bound or PositionBound.unbounded(), allow_stale, max_lag, clock.now + timeout))
    except DispatchError as e:
        raise from_dispatch(e) from None


def served(out) -> dict[int, str]:
    """partition -> the node whose rows came back."""
    return {r["p"]: r["node"] for b in out.batches for r in b.to_pylist()}


def doubling(sleeps: list[float]) -> bool:
    return sleeps[0] == pytest.approx(0.02) and all(
        b == pytest.approx(min(a * 2, 0.4)) for a, b in zip(sleeps, sleeps[1:]))


# ---- retried until an answer ----------------------------------------------------------------
@pytest.mark.parametrize("failure", RETRYABLE + [UNREACHABLE], ids=lambda f: getattr(f, "value", f))
def test_a_failing_owner_is_asked_again_with_backoff_until_it_answers(clock, make, failure) -> None:
    world = World(info("n1", active=[0]))
    world.script["n1"] = [failure, failure, failure, "ok"]
    out = gather(make(world), clock)
    assert served(out) == {0: "n1"}
    assert [c[0] for c in world.calls] == ["n1"] * 4
    assert clock.sleeps == pytest.approx([0.02, 0.04, 0.08])  # backoff between the attempts, doubling


@pytest.mark.parametrize("failure", RETRYABLE + [UNREACHABLE], ids=lambda f: getattr(f, "value", f))
def test_the_view_is_read_again_and_the_partition_follows_its_new_owner(clock, make, failure) -> None:
    """The owner fails; meanwhile heartbeats say n2 took the partition over: n2 is asked."""
    world = World(info("n1", active=[0]), info("n2"))
    world.script["n1"] = [failure]
    clock.on_sleep = lambda n: n == 2 and world.move(info("n1"), info("n2", active=[0]))
    out = gather(make(world), clock)
    assert served(out) == {0: "n2"}
    assert [c[0] for c in world.calls] == ["n1", "n1", "n2"]
    assert out.nodes == {"n2"} and out.partitions == {(0, 0)}


@pytest.mark.parametrize("failure", RETRYABLE + [UNREACHABLE], ids=lambda f: getattr(f, "value", f))
def test_retries_go_on_until_the_deadline_then_the_query_fails_naming_the_partitions(clock, make, failure) -> None:
    """n1 holds 0 and 2 and never answers them; n2 answers 1 and 3 at once. No partial
    answer: the query fails, naming 0 and 2 only, after retrying them up to the deadline."""
    world = World(info("n1", active=[0, 2]), info("n2", active=[1, 3]))
    world.script["n1"] = [failure]
    started = clock.now
    with pytest.raises(SqlError) as e:
        gather(make(world), clock, (0, 1, 2, 3), timeout=3.0)
    err = e.value
    want = "NOT_UP_TO_BOUND" if failure is FailureReason.NOT_UP_TO_BOUND else "UNAVAILABLE"
    assert (err.code, err.partitions) == (want, [0, 2]), err.message
    assert "partitions [0, 2]" in err.message and "partition 0:" in err.message and "partition 2:" in err.message
    assert "partition 1" not in err.message and "partition 3" not in err.message
    if want == "UNAVAILABLE":
        assert err.retry_after
    # n2 was asked once (its partitions answered); n1 again and again, until the deadline
    assert sum(1 for c in world.calls if c[0] == "n2") == 1
    assert sum(1 for c in world.calls if c[0] == "n1") == len(clock.sleeps) + 1
    assert doubling(clock.sleeps) and clock.sleeps[-1] == pytest.approx(0.4)
    assert started + 3.0 - 0.4 <= clock.now <= started + 3.0  # it gave up only when another wait would pass it


def test_one_call_per_node_carries_all_its_partitions_and_local_ones_run_in_process(clock, make) -> None:
    world = World(info("me", active=[0, 3]), info("n1", active=[1]), info("n2", active=[2]))
    out = gather(make(world), clock, (0, 1, 2, 3))
    assert served(out) == {0: "me", 1: "n1", 2: "n2", 3: "me"}
    assert sorted(world.calls) == [("me", (0, 3), True), ("n1", (1,), True), ("n2", (2,), True)]
    assert out.position == Position({TOPIC: {0: 5, 1: 5, 2: 5, 3: 5}})
    assert clock.sleeps == []


def test_an_answered_partition_is_not_asked_again(clock, make) -> None:
    world = World(info("n1", active=[0, 1]))
    calls = iter([[FailureReason.NOT_ACTIVE, "ok"], ["ok"]])

    def half(node, req, real=world.answer):  # partition 0 fails once, 1 answers at once
        world.calls.append((node, tuple(req.partitions), req.require_active))
        script = next(calls)
        return [QueryResult.failed(p, s, "scripted") if isinstance(s, FailureReason)
                else QueryResult.success(p, pa.record_batch({"node": [node], "p": [p]}), Position.of(TOPIC, p, 5))
                for p, s in zip(req.partitions, script)]

    world.answer = half
    out = gather(make(world), clock, (0, 1))
    assert served(out) == {0: "n1", 1: "n1"} and sum(b.num_rows for b in out.batches) == 2
    assert [c[1] for c in world.calls] == [(0, 1), (0,)]


@pytest.mark.parametrize(("code", "want"), [(None, "INTERNAL"), ("INVALID_DATA", "INVALID_DATA")])
def test_a_store_failure_is_not_retried(clock, make, code, want) -> None:
    world = World(info("n1", active=[0]))
    world.script["n1"] = [code or "BROKEN"]
    with pytest.raises(SqlError) as e:
        gather(make(world), clock)
    assert e.value.code == want
    assert len(world.calls) == 1 and clock.sleeps == []


# ---- allow_stale and max_lag -------------------------------------------------------------------
def stale_world() -> World:
    """Partition 0: active on n1, standbys n2 (lag 2) and n3 (lag 7)."""
    return World(info("n1", active=[0]), info("n2", standby=[0], lags={0: 2}), info("n3", standby=[0], lags={0: 7}))


@pytest.mark.parametrize("failure", [FailureReason.NOT_ACTIVE, FailureReason.NOT_PRESENT, UNREACHABLE],
                         ids=lambda f: getattr(f, "value", f))
def test_allow_stale_falls_back_to_the_least_lagging_standby_within_max_lag(clock, make, failure) -> None:
    world = stale_world()
    world.script["n1"] = [failure]
    out = gather(make(world), clock, allow_stale=True, max_lag=3)
    assert served(out) == {0: "n2"}
    # the owner first, then the standby; a stale read never requires the active copy
    assert world.calls == [("n1", (0,), False), ("n2", (0,), False)]


def test_allow_stale_skips_a_failing_standby_for_the_next_within_max_lag(clock, make) -> None:
    world = stale_world()
    world.script["n1"] = world.script["n2"] = [UNREACHABLE]
    out = gather(make(world), clock, allow_stale=True, max_lag=10)
    assert served(out) == {0: "n3"}
    assert [c[0] for c in world.calls] == ["n1", "n2", "n3"]


def test_allow_stale_never_reads_a_standby_beyond_max_lag(clock, make) -> None:
    world = stale_world()
    world.script["n1"] = [UNREACHABLE]
    with pytest.raises(SqlError) as e:
        gather(make(world), clock, allow_stale=True, max_lag=1)
    assert (e.value.code, e.value.partitions) == ("UNAVAILABLE", [0])
    assert {c[0] for c in world.calls} == {"n1"}  # n2 (lag 2) and n3 (lag 7) are too far behind
    # within the bound, n2 but never n3
    world, clock.sleeps[:] = stale_world(), []
    world.script["n1"] = world.script["n2"] = [UNREACHABLE]
    with pytest.raises(SqlError):
        gather(make(world), clock, allow_stale=True, max_lag=2)
    assert {c[0] for c in world.calls} == {"n1", "n2"}


def test_without_allow_stale_no_standby_is_read(clock, make) -> None:
    world = stale_world()
    world.script["n1"] = [UNREACHABLE]
    with pytest.raises(SqlError) as e:
        gather(make(world), clock)
    assert (e.value.code, e.value.partitions) == ("UNAVAILABLE", [0])
    assert {c[0] for c in world.calls} == {"n1"}


def test_a_standby_that_catches_up_within_max_lag_is_then_read(clock, make) -> None:
    """max_lag is judged on the view as it is now: a standby's next heartbeat (lag 0) counts."""
    world = stale_world()
    world.script["n1"] = [UNREACHABLE]
    clock.on_sleep = lambda n: n == 3 and world.move(info("n3", standby=[0], lags={0: 0}))
    out = gather(make(world), clock, allow_stale=True, max_lag=0)
    assert served(out) == {0: "n3"}
    assert "n2" not in {c[0] for c in world.calls}


def test_a_range_query_over_all_partitions_goes_to_every_owner(clock, make) -> None:
    world = World(info("n1", active=[0, 1]), info("n2", active=[2, 3]))
    out = make(world).gather("s", 4, [SubQuery(RangeQuery(), None)], None, ReadOptions(deadline=clock.now + 1))
    assert served(out) == {0: "n1", 1: "n1", 2: "n2", 3: "n2"}


def test_a_node_whose_key_port_cannot_take_calls_is_asked_over_http(clock, make, monkeypatch) -> None:
    world = World(info("n1", active=[0, 1]), info("n2", active=[2, 3], key_port=False))
    d = make(world)
    over: list[str] = []

    class NoPort:
        def query(self, req, timeout):
            over.append("port")
            raise CallUnavailable("n1:2: ConnectionRefusedError")

        send = query  # refused as it is sent

    class Http(FakeClient):
        def query(self, req, timeout):
            over.append(f"http {self.node}")
            return super().query(req, timeout)

    monkeypatch.setattr(d, "_call_client", lambda endpoint: NoPort())
    monkeypatch.setattr(d, "_client", lambda endpoint: Http(world, endpoint))
    out = d.gather("s", 4, [SubQuery(RangeQuery(), None)], None, ReadOptions(deadline=clock.now + 1))
    assert served(out) == {0: "n1", 1: "n1", 2: "n2", 3: "n2"}
    # n1 has a key port (tried, then HTTP); n2 has none (HTTP only)
    assert sorted(over) == ["http n1", "http n2", "port"]


# ---- the point lookup's one call (read_key) --------------------------------------------------
class KeyClient(FakeClient):
    def read_key(self, store: str, topic: str, partition: int, key: bytes, at: int | None,
                 timeout: float) -> StoredEntry | None:
        self.world.calls.append((self.node, (partition,), at))
        return StoredEntry(b"v", Position.of(topic, partition, 5))


@pytest.fixture
def make_key(monkeypatch, make):
    def build(world: World, node_id: str = "me") -> Dispatcher:
        d = make(world, node_id)
        monkeypatch.setattr(d, "_key_client", lambda endpoint: KeyClient(world, endpoint))
        return d

    return build


def test_a_key_is_read_from_its_active_owner_in_one_call(clock, make_key) -> None:
    world = World(info("n1", active=[0, 1]), info("n2", active=[2, 3], standby=[0]))
    entry = make_key(world).read_key("s", 0, b"k", ReadOptions(deadline=clock.now + 1))
    assert entry == StoredEntry(b"v", Position.of(TOPIC, 0, 5)) and world.calls == [("n1", (0,), None)]
    # the token's offset for the partition goes along, for the owner to check
    token = PositionBound.at(Position.of(TOPIC, 0, 9))
    make_key(world).read_key("s", 0, b"k", ReadOptions(token, deadline=clock.now + 1))
    assert world.calls[-1] == ("n1", (0,), 9)


def test_a_key_read_is_left_to_the_general_path_when_there_is_no_one_call(clock, make_key) -> None:
    world = World(info("n1", active=[0]), info("me", active=[1]), info("n2", standby=[2]),
                  info("n3", active=[3], key_port=False))
    d = make_key(world)
    options = ReadOptions(deadline=clock.now + 1)
    assert d.read_key("s", 1, b"k", options) is None  # this node owns it: its own read_local said no
    assert d.read_key("s", 2, b"k", options) is None  # only a standby: gather decides (token, stale)
    assert d.read_key("s", 2, b"k", ReadOptions(allow_stale=True, deadline=clock.now + 1)) is None
    assert d.read_key("s", 3, b"k", options) is None  # its owner takes no key calls (--key-port off)
    assert d.read_key("nosuch", 0, b"k", options) is None
    assert d.read_key("s", 0, b"k", ReadOptions(deadline=clock.now)) is None  # no time left
    assert world.calls == []


def test_calls_to_other_nodes_go_out_before_the_local_part_and_are_abandoned_if_it_fails(clock, make,
                                                                                          monkeypatch) -> None:
    world = World(info("me", active=[0]), info("n1", active=[1]), info("n2", active=[2, 3]))
    d = make(world)
    pending: list[FakePending] = []
    order: list[str] = []

    class Sending(FakeClient):
        def send(self, req, timeout):
            order.append(f"sent {self.node}")
            p = super().send(req, timeout)
            pending.append(p)
            return p

    monkeypatch.setattr(d, "_call_client", lambda endpoint: Sending(world, endpoint))
    local = d.node.execute
    monkeypatch.setattr(d.node, "execute", lambda req: order.append("local") or local(req))
    out = gather(d, clock, (0, 1, 2, 3))
    assert served(out) == {0: "me", 1: "n1", 2: "n2", 3: "n2"}
    assert order == ["sent n1", "sent n2", "local"] and d.pool._threads == set()  # no pool thread was needed

    def failing(req):
        raise RuntimeError("the local part failed")

    pending.clear()
    monkeypatch.setattr(d.node, "execute", failing)
    with pytest.raises(RuntimeError):
        gather(d, clock, (0, 1, 2, 3))
    assert len(pending) == 2 and all(p.abandoned for p in pending)

    class FailsForN2(Sending):  # a call that cannot even be made, after another was sent
        def send(self, req, timeout):
            if self.node == "n2":
                raise RuntimeError("the request does not encode")
            return super().send(req, timeout)

    pending.clear()
    monkeypatch.setattr(d, "_call_client", lambda endpoint: FailsForN2(world, endpoint))
    with pytest.raises(RuntimeError):
        gather(d, clock, (0, 1, 2, 3))
    assert len(pending) == 1 and pending[0].abandoned


# ---- a global store: this node's own copies answer every partition ----------------------------
def global_store(d: Dispatcher) -> None:
    d.node.stores["s"].is_global = True


def test_a_global_store_is_answered_here_though_the_view_names_other_owners(clock, make) -> None:
    world = World(info("me"), info("n1", active=[0, 1]), info("n2", active=[2, 3]))
    d = make(world)
    global_store(d)
    out = gather(d, clock, (0, 1, 2, 3))
    assert served(out) == {0: "me", 1: "me", 2: "me", 3: "me"}
    assert world.calls == [("me", (0, 1, 2, 3), True)]  # one in-process request, a current copy required


def test_a_global_store_with_allow_stale_takes_any_copy_within_max_lag(clock, make) -> None:
    world = World(info("me"), info("n1", active=[0]))
    d = make(world)
    global_store(d)
    out = gather(d, clock, (0,), allow_stale=True, max_lag=5)
    assert served(out) == {0: "me"} and world.calls == [("me", (0,), False)]


def test_a_global_copy_beyond_max_lag_is_waited_for_and_then_refused_never_sent_elsewhere(clock, make) -> None:
    world = World(info("me"), info("n1", active=[0], lags={0: 0}))
    d = make(world)
    global_store(d)
    d.node.lags = {0: 50}
    clock.on_sleep = lambda n: n == 3 and d.node.lags.update({0: 2})  # it catches up meanwhile
    out = gather(d, clock, (0,), allow_stale=True, max_lag=5)
    assert served(out) == {0: "me"} and [c[0] for c in world.calls] == ["me"]
    d.node.lags = {0: 50}
    clock.on_sleep = lambda n: None
    with pytest.raises(SqlError) as e:
        gather(d, clock, (0,), allow_stale=True, max_lag=5)
    assert e.value.code == "UNAVAILABLE" and "50 records behind, more than max_lag 5" in e.value.message
    assert [c[0] for c in world.calls] == ["me"]  # n1, within max_lag, was never asked


def test_a_token_read_of_a_global_store_waits_for_this_nodes_copies_first(clock, make) -> None:
    world = World(info("me"))
    d = make(world)
    global_store(d)
    out = gather(d, clock, (0, 2), bound=PositionBound.at(Position({TOPIC: {0: 7, 2: 9}})))
    assert served(out) == {0: "me", 2: "me"}
    assert d.node.waits == [("s", {0: 7, 2: 9})]
    gather(d, clock, (1,))  # no token: nothing to wait for
    assert len(d.node.waits) == 1


def test_a_global_stores_key_is_never_read_from_another_node(clock, make) -> None:
    world = World(info("me"), info("n1", active=[0]))
    d = make(world)
    global_store(d)
    assert d.read_key("s", 0, b"k", ReadOptions(deadline=clock.now + 1)) is None


# ---- a consistency token's copy behind it: asked again once it says it caught up -------------
class Watch:
    """A positions watch whose node says it reached the offset once ``reached`` is set."""

    def __init__(self, reached: bool) -> None:
        self.reached, self.waits = reached, []

    def wait_reached(self, store: str, partition: int, offset: int, until: float) -> bool:
        self.waits.append((store, partition, offset))
        return self.reached


@pytest.mark.parametrize("reached", [True, False], ids=["caught up", "still behind"])
def test_a_token_read_behind_at_its_owner_is_asked_again_when_the_owner_says_it_caught_up(
        clock, make, monkeypatch, reached) -> None:
    world = World(info("me"), info("n1", active=[0]))
    world.script["n1"] = [FailureReason.NOT_UP_TO_BOUND, FailureReason.NOT_UP_TO_BOUND, "ok"]
    d = make(world)
    watch = Watch(reached)
    monkeypatch.setattr(d, "_watch", lambda endpoint: endpoint == "n1:2" and watch)
    out = gather(d, clock, (0,), bound=PositionBound.at(Position({TOPIC: {0: 7}})))
    assert served(out) == {0: "n1"} and [c[0] for c in world.calls] == ["n1"] * 3
    assert watch.waits == [("s", 0, 7)] * 2  # the owner's word waited for before each next round
    if reached:
        assert clock.sleeps == []  # no back-off slept out
    else:
        assert doubling(clock.sleeps) and len(clock.sleeps) == 2  # the back-off as before


@pytest.mark.parametrize("held", [True, False], ids=["held to the deadline", "unreachable"])
def test_a_token_read_whose_owner_holds_the_call_to_the_deadline_fails_as_not_up_to_bound(
        clock, make, monkeypatch, held) -> None:
    """The owner was behind the token, and, asked again, holds the call waiting for the records
    until the deadline ends it: the read fails NOT_UP_TO_BOUND, as the owner last said. An owner
    that stopped answering before the deadline makes it UNAVAILABLE, as before."""
    world = World(info("me"), info("n1", active=[0]))
    deadline = clock.now + 1.0

    def held_to_the_deadline() -> str:
        clock.now = deadline
        return UNREACHABLE

    world.script["n1"] = [FailureReason.NOT_UP_TO_BOUND, held_to_the_deadline if held else UNREACHABLE]
    d = make(world)
    monkeypatch.setattr(d, "_watch", lambda endpoint: Watch(True))
    with pytest.raises(SqlError) as e:
        gather(d, clock, (0,), timeout=1.0, bound=PositionBound.at(Position({TOPIC: {0: 7}})))
    assert e.value.code == ("NOT_UP_TO_BOUND" if held else "UNAVAILABLE"), e.value.message


def test_a_token_read_behind_here_waits_for_this_nodes_copy_before_asking_again(clock, make, monkeypatch) -> None:
    world = World(info("me", active=[0]))
    world.script["me"] = [FailureReason.NOT_UP_TO_BOUND, "ok"]
    d = make(world)
    monkeypatch.setattr(d.node, "answerable_offsets_of", lambda store, parts: (0, [7 for _ in parts]))
    out = gather(d, clock, (0,), bound=PositionBound.at(Position({TOPIC: {0: 7}})))
    assert served(out) == {0: "me"} and d.node.waits == [("s", {0: 7})] and clock.sleeps == []


def test_a_partition_that_failed_otherwise_is_backed_off_as_before(clock, make, monkeypatch) -> None:
    world = World(info("n1", active=[0, 1]))
    world.script["n1"] = [FailureReason.NOT_PRESENT, "ok"]  # not behind the token: moved
    d = make(world)
    monkeypatch.setattr(d, "_watch", lambda endpoint: pytest.fail("no copy was behind the token"))
    gather(d, clock, (0, 1), bound=PositionBound.at(Position({TOPIC: {0: 7, 1: 3}})))
    assert clock.sleeps == pytest.approx([0.02])
