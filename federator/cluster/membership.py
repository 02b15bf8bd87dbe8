"""Membership: every node's heartbeat in the compacted ``<APP>-nodes`` topic, and the routing
view every node builds from them. (DescribeGroups is not used: not every broker lists members.)"""

from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Message

STATES = ("CREATED", "REBALANCING", "RUNNING", "PENDING_SHUTDOWN", "ERROR")
HEARTBEAT_SECONDS = 1.0
DEAD_AFTER_SECONDS = 6.0
# A process that has not beaten for this long is gone, as far as its node id is concerned: a
# restarted node waits out its dead predecessor's last record for at most this long.
SAME_ID_LIVE_SECONDS = 3 * HEARTBEAT_SECONDS


def nodes_topic(application_id: str) -> str:
    return f"{application_id}-nodes"


@dataclass
class NodeInfo:
    node_id: str
    endpoint: str
    state: str
    active: dict[str, list[int]] = field(default_factory=dict)  # store -> partitions
    standby: dict[str, list[int]] = field(default_factory=dict)
    positions: dict[str, dict[int, int]] = field(default_factory=dict)  # store -> partition -> offset
    lags: dict[str, dict[int, int]] = field(default_factory=dict)  # store -> partition -> records behind
    restoring: dict[str, list[int]] = field(default_factory=dict)  # active partitions not yet caught up
    timestamp_ms: int = 0
    # Which process beats: a random id drawn at start, and the start time. A node id is one
    # process at a time; these tell a live rival from a record left by this node before a restart.
    incarnation: str = ""
    started_ms: int = 0
    key_endpoint: str | None = None  # host:port of its point lookup call (federator.node.key_server)
    # global stores' partitions it keeps (every node keeps them all, outside the group's
    # assignment; it answers them alone, so they route nowhere); restoring ones in ``restoring``
    global_copies: dict[str, list[int]] = field(default_factory=dict)

    def routing(self) -> tuple:
        """What peers place standbys and route by; positions and lags travel with the regular beat."""
        def frozen(d: dict[str, list[int]]) -> tuple:
            return tuple(sorted((s, tuple(sorted(ps))) for s, ps in d.items() if ps))

        return (self.endpoint, self.state, frozen(self.active), frozen(self.standby), frozen(self.restoring),
                frozen(self.global_copies), self.incarnation, self.key_endpoint)

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "node_id": self.node_id,
                "endpoint": self.endpoint,
                "state": self.state,
                "active": self.active,
                "standby": self.standby,
                "positions": {s: {str(p): o for p, o in d.items()} for s, d in self.positions.items()},
                "lags": {s: {str(p): o for p, o in d.items()} for s, d in self.lags.items()},
                "restoring": self.restoring,
                "global": self.global_copies,
                "timestamp_ms": self.timestamp_ms,
                "incarnation": self.incarnation,
                "started_ms": self.started_ms,
                "key_endpoint": self.key_endpoint,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> NodeInfo:
        d = json.loads(data)
        return cls(
            node_id=d["node_id"],
            endpoint=d["endpoint"],
            state=d["state"],
            active={s: list(ps) for s, ps in d.get("active", {}).items()},
            standby={s: list(ps) for s, ps in d.get("standby", {}).items()},
            positions={s: {int(p): o for p, o in m.items()} for s, m in d.get("positions", {}).items()},
            lags={s: {int(p): o for p, o in m.items()} for s, m in d.get("lags", {}).items()},
            restoring={s: list(ps) for s, ps in d.get("restoring", {}).items()},
            global_copies={s: list(ps) for s, ps in d.get("global", {}).items()},
            timestamp_ms=int(d.get("timestamp_ms", 0)),
            incarnation=str(d.get("incarnation", "")),
            started_ms=int(d.get("started_ms", 0)),
            key_endpoint=d.get("key_endpoint"),
        )

    def to_public(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "endpoint": self.endpoint,
            "state": self.state,
            "active": self.active,
            "standby": self.standby,
            "restoring": self.restoring,
            "global": self.global_copies,
            "lags": {s: {str(p): o for p, o in d.items()} for s, d in self.lags.items()},
            "positions": {s: {str(p): o for p, o in d.items()} for s, d in self.positions.items()},
            "last_heartbeat_ms": self.timestamp_ms,
            "incarnation": self.incarnation,
            "started_ms": self.started_ms,
            "key_endpoint": self.key_endpoint,
        }


def same_id(mine: NodeInfo, other: NodeInfo, now_ms: float) -> str:
    """What a node makes of a heartbeat record under its own node id.

    ``"self"``: its own beat. ``"gone"``: another process's, but that process left (it said
    PENDING_SHUTDOWN) or stopped beating (nothing for SAME_ID_LIVE_SECONDS): typically this
    node's own record from before a restart. ``"unknown"``: recent, but beaten before this
    process started, so it may be a process that has just died; its next beat (or its silence)
    tells. ``"older"``: another live process (it beat after this one started) that has had the
    id longer: this one must refuse to serve. ``"newer"``: a live process that started after
    this one: it refuses (the same rule on its side). Equal start times fall to the incarnation.
    """
    if other.incarnation == mine.incarnation and other.started_ms == mine.started_ms:
        return "self"
    if other.state == "PENDING_SHUTDOWN" or now_ms - other.timestamp_ms >= SAME_ID_LIVE_SECONDS * 1000:
        return "gone"
    if other.timestamp_ms <= mine.started_ms:
        return "unknown"
    return "older" if (other.started_ms, other.incarnation) < (mine.started_ms, mine.incarnation) else "newer"


class ClusterView:
    """The live nodes, from their heartbeats: who is active and standby for each partition."""

    def __init__(self, dead_after: float = DEAD_AFTER_SECONDS) -> None:
        self._nodes: dict[str, NodeInfo] = {}
        self._lock = threading.Lock()
        self.dead_after = dead_after
        self.changed = threading.Event()
        # live() as last worked out, and the wall-clock span (ms) it holds for: routing asks it
        # once per partition of every read, and it changes only with a beat or when one goes stale
        self._live: tuple[float, float, list[NodeInfo]] | None = None

    def apply(self, msg: Message) -> bool:
        """Fold one heartbeat in; True if it changed who the node is or what it hosts (its
        routing), False for a beat that only moves its positions, lags and time."""
        key = msg.key()
        if key is None:
            return False
        node_id = key.decode()
        with self._lock:
            before = self._nodes.get(node_id)
            if msg.value() is None:
                self._nodes.pop(node_id, None)
                changed = before is not None
            else:
                try:
                    info = self._nodes[node_id] = NodeInfo.from_json(msg.value())
                except (ValueError, KeyError):
                    return False
                changed = before is None or before.routing() != info.routing()
            self._live = None
        self.changed.set()
        return changed

    def update_local(self, info: NodeInfo) -> None:
        """Our own heartbeat counts at once, before it comes back from the topic."""
        with self._lock:
            self._nodes[info.node_id] = info
            self._live = None

    def clear(self) -> None:
        with self._lock:
            self._nodes.clear()
            self._live = None

    def live(self) -> list[NodeInfo]:
        """The nodes that beat within ``dead_after`` and are not shutting down, by id (one list,
        shared by the callers until the view changes: not to be changed in place)."""
        now_ms = time.time() * 1000
        kept = self._live
        if kept is not None and kept[0] <= now_ms < kept[1]:
            return kept[2]
        with self._lock:
            dead_ms = self.dead_after * 1000
            nodes = sorted((n for n in self._nodes.values()
                            if now_ms - n.timestamp_ms < dead_ms and n.state != "PENDING_SHUTDOWN"),
                           key=lambda n: n.node_id)
            # until the first of them goes stale (none comes back to life without a beat)
            self._live = (now_ms, min((n.timestamp_ms + dead_ms for n in nodes), default=math.inf), nodes)
            return nodes

    def get(self, node_id: str) -> NodeInfo | None:
        return next((n for n in self.live() if n.node_id == node_id), None)

    def active_owner(self, store: str, partition: int) -> NodeInfo | None:
        for n in self.live():
            if partition in n.active.get(store, ()):
                return n
        return None

    def standbys(self, store: str, partition: int) -> list[NodeInfo]:
        return [n for n in self.live() if partition in n.standby.get(store, ())]

    def to_public(self) -> dict[str, Any]:
        return {"nodes": [n.to_public() for n in self.live()]}


def place_standbys(live_ids: list[str], active_owner: str | None, partition: int, replicas: int) -> list[str]:
    """Deterministic standby placement: the ``replicas`` nodes after the active one in id order.

    Every node computes the same answer from the same view. Without a known active owner the
    walk starts at ``partition`` so standbys still spread evenly.
    """
    ids = sorted(live_ids)
    if replicas <= 0 or not ids:
        return []
    start = ids.index(active_owner) + 1 if active_owner in ids else partition % len(ids)
    ring = [ids[(start + i) % len(ids)] for i in range(len(ids))]
    return [n for n in ring if n != active_owner][:replicas]


def read_live_nodes(bootstrap_servers: str, application_id: str, timeout: float = 10.0) -> list[NodeInfo]:
    """The nodes of an application that beat within the last SAME_ID_LIVE_SECONDS, read from its
    membership topic from outside the cluster (none when the topic does not exist)."""
    from confluent_kafka import KafkaError, TopicPartition

    from federator import kafka

    topic = nodes_topic(application_id)
    if kafka.topic_id(kafka.admin(bootstrap_servers), topic, timeout=timeout) is None:
        return []
    view = ClusterView(dead_after=SAME_ID_LIVE_SECONDS)
    consumer = kafka.reader(bootstrap_servers)
    consumer.assign([TopicPartition(topic, 0, 0)])
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            for msg in kafka.next_batch(consumer, 1000, 0.5):
                if msg.error() is None:
                    view.apply(msg)
                elif msg.error().code() == KafkaError._PARTITION_EOF:
                    return view.live()
    finally:
        consumer.close()
    return view.live()
