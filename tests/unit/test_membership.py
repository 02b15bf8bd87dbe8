"""Standby placement and the routing view built from heartbeats."""

from __future__ import annotations

import time
from collections import Counter

from federator.cluster.membership import SAME_ID_LIVE_SECONDS, ClusterView, NodeInfo, place_standbys, same_id


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


def test_a_node_drops_out_of_the_view_when_its_beat_goes_stale_and_comes_back_with_a_beat(monkeypatch) -> None:
    now = [1_000_000.0]
    monkeypatch.setattr(time, "time", lambda: now[0])
    view = ClusterView(dead_after=6)
    view.apply(Msg(b"n1", info("n1", {"s": [0]}).to_json()))
    now[0] += 4
    view.apply(Msg(b"n2", info("n2", {"s": [1]}).to_json()))
    assert [n.node_id for n in view.live()] == ["n1", "n2"]
    now[0] += 1.5  # n1 last beat 5.5 s ago
    assert [n.node_id for n in view.live()] == ["n1", "n2"]
    now[0] += 1  # 6.5 s
    assert [n.node_id for n in view.live()] == ["n2"]
    assert view.active_owner("s", 0) is None
    view.update_local(info("n1", {"s": [0]}))  # its beat again
    assert [n.node_id for n in view.live()] == ["n1", "n2"]
    assert view.active_owner("s", 0).node_id == "n1"
    now[0] += 10
    assert view.live() == []
    view.clear()
    now[0] -= 100  # a wall clock set back finds no view kept from the future
    assert view.live() == []


def test_heartbeats_round_trip() -> None:
    i = NodeInfo("n", "h:1", "RUNNING", {"s": [1]}, {"t": [2]}, {"s": {1: 10}}, {"s": {1: 0}}, {"s": [1]}, 5, "inc1", 3)
    assert NodeInfo.from_json(i.to_json()) == i
    # a record from before incarnations were beaten reads as an unknown process that started at 0
    old = NodeInfo.from_json(b'{"node_id":"n","endpoint":"h:1","state":"RUNNING","timestamp_ms":5}')
    assert (old.incarnation, old.started_ms) == ("", 0)


def test_one_live_process_per_node_id_the_newer_refuses() -> None:
    now = 1_000_000_000
    me = NodeInfo("n", "h:2", "CREATED", incarnation="b", started_ms=now - 500)

    def rival(beat_ago_ms: float, started_ago_ms: float, incarnation: str = "a", state: str = "RUNNING") -> NodeInfo:
        return NodeInfo("n", "h:1", state, timestamp_ms=int(now - beat_ago_ms), incarnation=incarnation,
                        started_ms=int(now - started_ago_ms))

    live = SAME_ID_LIVE_SECONDS * 1000
    assert same_id(me, NodeInfo("n", "h:2", "RUNNING", timestamp_ms=now, incarnation="b", started_ms=now - 500), now) == "self"
    # another process beat after we started and started before us: it has the id, we refuse
    assert same_id(me, rival(beat_ago_ms=100, started_ago_ms=60_000), now) == "older"
    # it started after us: it refuses, we keep serving
    assert same_id(me, rival(beat_ago_ms=100, started_ago_ms=200, incarnation="c"), now) == "newer"
    # the same start time: the incarnation decides, the same way on both sides
    twin = rival(beat_ago_ms=100, started_ago_ms=500, incarnation="a")
    assert same_id(me, twin, now) == "older"
    assert same_id(twin, NodeInfo("n", "h:2", "RUNNING", timestamp_ms=now - 50, incarnation="b", started_ms=now - 500),
                   now) == "newer"
    # our own record from before a restart: the process died; its last beat is before we started
    assert same_id(me, rival(beat_ago_ms=800, started_ago_ms=90_000), now) == "unknown"  # may still beat: wait
    assert same_id(me, rival(beat_ago_ms=live, started_ago_ms=90_000), now) == "gone"  # silent for a while: dead
    assert same_id(me, rival(beat_ago_ms=live + 60_000, started_ago_ms=90_000), now) == "gone"
    # a process that said it is leaving does not hold the id
    assert same_id(me, rival(beat_ago_ms=100, started_ago_ms=60_000, state="PENDING_SHUTDOWN"), now) == "gone"
    # a node of an older version beats no incarnation: live and after our start, it is the older one
    assert same_id(me, rival(beat_ago_ms=100, started_ago_ms=now, incarnation=""), now) == "older"


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
