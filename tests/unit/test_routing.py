"""Routing a partition to a node (targets_for) and the dispatcher's use of it: active owners only,
unless stale reads are allowed or a consistency token asks for no more than a standby has."""

from __future__ import annotations

import time

import pyarrow as pa
import pytest

from federator.cluster.membership import ClusterView, NodeInfo
from federator.dispatch import NodeCallError
from federator.dispatch.dispatcher import Dispatcher
from federator.dispatch.errors import Unavailable
from federator.plan.keys import SubQuery
from federator.query import KeyQuery, Position, PositionBound, StateQueryRequest
from federator.query.result import FailureReason, QueryResult
from federator.route.read_options import ReadOptions
from federator.route.router import Target, targets_for
from federator.sql.dispatch_errors import from_dispatch
from tests.unit import fake_node

TOPIC = "app-s-changelog"


def view(owner_restoring: bool = False, with_owner: bool = True) -> ClusterView:
    """Partition 0 of store s: active on n1 (at offset 12), standbys n2 (at 10, lag 2) and n3 (at 5, lag 7)."""
    v = ClusterView()
    now = int(time.time() * 1000)
    if with_owner:
        v.update_local(NodeInfo("n1", "n1:1", "RUNNING", {"s": [0]}, positions={"s": {0: 12}},
                                restoring={"s": [0]} if owner_restoring else {}, timestamp_ms=now))
    v.update_local(NodeInfo("n2", "n2:1", "RUNNING", standby={"s": [0]}, positions={"s": {0: 10}},
                            lags={"s": {0: 2}}, timestamp_ms=now))
    v.update_local(NodeInfo("n3", "n3:1", "RUNNING", standby={"s": [0]}, positions={"s": {0: 5}},
                            lags={"s": {0: 7}}, timestamp_ms=now))
    return v


def ids(targets: list[Target]) -> list[tuple[str, bool]]:
    return [(t.node_id, t.active) for t in targets]


def test_without_a_token_or_stale_permission_only_the_active_owner() -> None:
    assert ids(targets_for(view(), "s", 0, ReadOptions())) == [("n1", True)]
    assert targets_for(view(), "s", 0, ReadOptions(), frozenset({"n1"})) == []
    assert targets_for(view(with_owner=False), "s", 0, ReadOptions()) == []
    assert ids(targets_for(view(owner_restoring=True), "s", 0, ReadOptions())) == [("n1", True)]


def test_a_token_a_standby_has_reached_goes_to_it_while_the_owner_cannot_answer() -> None:
    # the owner answers: it is asked, and only it
    assert ids(targets_for(view(), "s", 0, ReadOptions(), at_least=8)) == [("n1", True)]
    # the owner failed: the standbys that reached offset 8 (n2, not n3), then the owner again
    assert ids(targets_for(view(), "s", 0, ReadOptions(), frozenset({"n1"}), at_least=8)) == [("n2", False), ("n1", True)]
    # no owner in the view (its beats stopped, or a rebalance): the standbys that reached it
    assert ids(targets_for(view(with_owner=False), "s", 0, ReadOptions(), at_least=5)) == [("n2", False), ("n3", False)]
    # the owner is restoring the partition: standbys first
    assert ids(targets_for(view(owner_restoring=True), "s", 0, ReadOptions(), at_least=8)) == [("n2", False), ("n1", True)]
    # no standby has reached the token: the owner only
    assert ids(targets_for(view(), "s", 0, ReadOptions(), frozenset({"n1"}), at_least=11)) == [("n1", True)]
    assert targets_for(view(with_owner=False), "s", 0, ReadOptions(), at_least=11) == []
    # a standby that failed is not asked again
    assert ids(targets_for(view(), "s", 0, ReadOptions(), frozenset({"n1", "n2"}), at_least=5)) == [("n3", False), ("n1", True)]


def test_stale_reads_are_routed_as_before() -> None:
    assert ids(targets_for(view(), "s", 0, ReadOptions(allow_stale=True))) == [("n1", True), ("n2", False), ("n3", False)]
    assert ids(targets_for(view(), "s", 0, ReadOptions(allow_stale=True, max_lag=3), frozenset({"n1"}))) == [("n2", False), ("n1", True)]


class FakeNode(fake_node.FakeNode):
    def __init__(self, v: ClusterView) -> None:
        super().__init__(v, {"s": type("Defn", (), {"topic": TOPIC, "is_global": False})()})


class FakeClient:
    """n1 (the owner) is dead; the standbys answer when not asked for an active copy."""

    def __init__(self, endpoint: str, calls: list) -> None:
        self.endpoint, self.calls = endpoint, calls

    def query(self, req: StateQueryRequest, timeout: float) -> list[QueryResult]:
        node = self.endpoint.split(":")[0]
        self.calls.append((node, req.require_active, req.partitions))
        if node == "n1":
            raise NodeCallError(self.endpoint, "no answer (connection refused)")
        at = {"n2": 10, "n3": 5}[node]
        out = []
        for p in req.partitions:
            if req.require_active:
                out.append(QueryResult.failed(p, FailureReason.NOT_ACTIVE, "a standby copy"))
            elif not req.bound.is_satisfied_by(Position.of(TOPIC, p, at), TOPIC, p):
                out.append(QueryResult.failed(p, FailureReason.NOT_UP_TO_BOUND, "behind"))
            else:
                out.append(QueryResult.success(p, pa.record_batch({"v": [node]}), Position.of(TOPIC, p, at)))
        return out


@pytest.fixture
def dispatcher(monkeypatch):
    calls: list = []
    d = Dispatcher(FakeNode(view()), max_workers=2)
    monkeypatch.setattr(d, "_client", lambda endpoint: FakeClient(endpoint, calls))
    yield d, calls
    d.pool.shutdown()


def gather(d: Dispatcher, bound: PositionBound, allow_stale: bool = False, timeout: float = 0.5):
    return d.gather("s", 1, [SubQuery(KeyQuery("k"), (0,))], None,
                    ReadOptions(bound, allow_stale, None, time.monotonic() + timeout))


def test_gather_reads_a_token_from_a_standby_when_the_owner_is_down(dispatcher) -> None:
    d, calls = dispatcher
    out = gather(d, PositionBound.at(Position.of(TOPIC, 0, 8)))
    assert [b.column("v").to_pylist() for b in out.batches] == [["n2"]]
    assert out.position == Position.of(TOPIC, 0, 10)
    # the owner first (it must be the active copy), then the standby, asked without require_active
    assert calls == [("n1", True, (0,)), ("n2", False, (0,))]


def test_gather_without_a_token_does_not_read_a_standby(dispatcher) -> None:
    d, calls = dispatcher
    with pytest.raises(Unavailable) as e:
        gather(d, PositionBound.unbounded())
    assert e.value.partitions == [0] and from_dispatch(e.value).code == "UNAVAILABLE"
    assert {c[0] for c in calls} == {"n1"}
    # a token for another store's topic says nothing about this one
    calls.clear()
    with pytest.raises(Unavailable):
        gather(d, PositionBound.at(Position.of("other-changelog", 0, 1)))
    assert {c[0] for c in calls} == {"n1"}


def test_gather_with_a_token_no_standby_has_reached_waits_for_the_owner(dispatcher) -> None:
    d, calls = dispatcher
    with pytest.raises(Unavailable):
        gather(d, PositionBound.at(Position.of(TOPIC, 0, 11)))
    assert {c[0] for c in calls} == {"n1"}
