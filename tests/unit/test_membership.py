"""Standby placement and the routing view built from heartbeats."""

from __future__ import annotations

import time
from collections import Counter

from federator.node.membership import ClusterView, NodeInfo, place_standbys


class Msg:
    def __init__(self, key: bytes, value: bytes | None) -> None:
        self._k, self._v = key, value

    def key(self) -> bytes:
        return self._k

    def value(self) -> bytes | None:
        return self._v


def test_placement_is_deterministic_skips_the_active_and_spreads() -> None:
    ids = ["c", "a", "b", "d"]
    assert place_standbys(ids, "b", 0, 1) == ["c"]
    assert place_standbys(ids, "d", 0, 2) == ["a", "b"]
    assert place_standbys(list(reversed(ids)), "d", 0, 2) == ["a", "b"]  # order of the view does not matter
    assert place_standbys(ids, "a", 3, 10) == ["b", "c", "d"]  # never more than the other nodes
    assert place_standbys(ids, "a", 3, 0) == []
    assert place_standbys([], None, 3, 1) == []
    # with no known owner the walk starts at the partition, so copies still spread
    spread = Counter(place_standbys(ids, None, p, 1)[0] for p in range(8))
    assert set(spread.values()) == {2}


def info(node_id: str, active: dict, standby: dict | None = None, age_s: float = 0.0, state: str = "RUNNING") -> NodeInfo:
    return NodeInfo(node_id, f"{node_id}:1", state, active, standby or {}, timestamp_ms=int((time.time() - age_s) * 1000))


def test_the_view_routes_by_live_heartbeats() -> None:
    view = ClusterView(dead_after=6)
    view.apply(Msg(b"n1", info("n1", {"s": [0, 1]}, {"s": [2]}).to_json()))
    view.apply(Msg(b"n2", info("n2", {"s": [2]}, {"s": [0, 1]}).to_json()))
    view.apply(Msg(b"n3", info("n3", {"s": [3]}, age_s=30).to_json()))  # heartbeats stopped: dropped
    view.apply(Msg(b"n4", info("n4", {"s": [4]}, state="PENDING_SHUTDOWN").to_json()))  # leaving: not routed to
    assert [n.node_id for n in view.live()] == ["n1", "n2"]
    assert view.active_owner("s", 1).node_id == "n1"
    assert view.active_owner("s", 3) is None
    assert [n.node_id for n in view.standbys("s", 0)] == ["n2"]
    view.apply(Msg(b"n1", None))  # a clean shutdown removes the record
    assert view.active_owner("s", 1) is None
    assert view.to_public()["nodes"][0]["node_id"] == "n2"


def test_heartbeats_round_trip() -> None:
    i = NodeInfo("n", "h:1", "RUNNING", {"s": [1]}, {"t": [2]}, {"s": {1: 10}}, {"s": {1: 0}}, {"s": [1]}, 5)
    assert NodeInfo.from_json(i.to_json()) == i


def test_a_beat_that_only_moves_positions_is_not_a_routing_change() -> None:
    view = ClusterView(dead_after=6)
    first = NodeInfo("n1", "n1:1", "RUNNING", {"s": [0, 1]}, {"s": [2]}, {"s": {0: 5}}, {"s": {2: 3}})
    assert view.apply(Msg(b"n1", first.to_json())) is True  # a new node
    later = NodeInfo("n1", "n1:1", "RUNNING", {"s": [1, 0]}, {"s": [2]}, {"s": {0: 9}}, {"s": {2: 0}},
                     timestamp_ms=first.timestamp_ms + 1000)
    assert view.apply(Msg(b"n1", later.to_json())) is False  # positions, lags, time, partition order
    for changed in (NodeInfo("n1", "n1:1", "RUNNING", {"s": [1]}, {"s": [0, 2]}),  # a partition moved
                    NodeInfo("n1", "n1:1", "REBALANCING", {"s": [1]}, {"s": [0, 2]}),
                    NodeInfo("n1", "n1:1", "REBALANCING", {"s": [1]}, {"s": [0, 2]}, restoring={"s": [1]}),
                    NodeInfo("n1", "n1:2", "REBALANCING", {"s": [1]}, {"s": [0, 2]}, restoring={"s": [1]})):
        assert view.apply(Msg(b"n1", changed.to_json())) is True
    assert view.apply(Msg(b"n1", None)) is True  # left
    assert view.apply(Msg(b"n1", None)) is False
