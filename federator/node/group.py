"""Active partitions come from Kafka's group protocol: the node joins the consumer group of
its application id, subscribed to every store's changelog.

The range assignor gives partition p of every topic with the same partition count to the
same member, so stores written with the same partitioner are co-partitioned. This consumer
only takes part in the group: its partitions are paused, and the materializer reads the
changelogs with its own consumer.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable

from confluent_kafka import Consumer, KafkaError, TopicPartition

from federator import kafka
from federator.settings import NodeSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GroupTimings:
    """How the node keeps its place in the group (`federator node --session-timeout-ms`,
    `--heartbeat-interval-ms`). A broker refuses a member whose session timeout is outside its
    group.min/max.session.timeout.ms (Apache Kafka's defaults: 6 s and 30 min) with
    INVALID_SESSION_TIMEOUT, so the default is the shortest every default broker accepts: a
    killed node's partitions move after about that long. The heartbeat is how soon a member
    hears of a rebalance, so it bounds how long a join waits for the others."""

    session_timeout_ms: int = NodeSettings.session_timeout_ms
    heartbeat_interval_ms: int = NodeSettings.heartbeat_interval_ms

    def __post_init__(self) -> None:
        if self.heartbeat_interval_ms <= 0 or self.session_timeout_ms <= self.heartbeat_interval_ms:
            raise ValueError(
                f"--heartbeat-interval-ms ({self.heartbeat_interval_ms}) must be above 0 and below "
                f"--session-timeout-ms ({self.session_timeout_ms}); a third of it or less is usual"
            )

    def refusal(self) -> str:
        return (f"the broker refused the group session timeout of {self.session_timeout_ms} ms "
                "(INVALID_SESSION_TIMEOUT): it must lie within the broker's group.min.session.timeout.ms and "
                "group.max.session.timeout.ms (Apache Kafka's defaults: 6000 and 1800000); "
                "set --session-timeout-ms within them")

    def consumer_config(self) -> dict[str, Any]:
        return {
            "session.timeout.ms": self.session_timeout_ms,
            "heartbeat.interval.ms": self.heartbeat_interval_ms,
            # how long a rebalance waits for members to join again; librdkafka wants it >= the session
            "max.poll.interval.ms": max(10_000, self.session_timeout_ms),
        }


GROUP_CONFIG: dict[str, Any] = {
    "partition.assignment.strategy": "range",
    "topic.metadata.refresh.interval.ms": 2000,
    # a request the broker never answers (seen after a broker restart) fails in 10 s, not 60
    "socket.timeout.ms": 10000,
    "enable.auto.commit": False,
    "auto.offset.reset": "earliest",
    "enable.partition.eof": False,
}
# How long stop() lets a join under way finish before leaving: a join takes a few seconds
# (on Apache Kafka a new group's first one waits group.initial.rebalance.delay.ms, 3 s).
LEAVE_AFTER_JOIN_SECONDS = 10.0


class GroupMember:
    """Runs the group consumer in its own thread; reports assignments as sets of (topic, partition)."""

    def __init__(
        self,
        bootstrap_servers: str,
        group_id: str,
        on_assignment: Callable[[set[tuple[str, int]]], None],
        on_rebalancing: Callable[[], None],
        client_id: str,
        timings: GroupTimings = GroupTimings(),
        on_refused: Callable[[str], None] = lambda why: None,
    ) -> None:
        self.timings = timings
        self.on_refused = on_refused  # the broker will never let this member in; says why
        self.bootstrap_servers = bootstrap_servers
        self.group_id = group_id
        self.on_assignment = on_assignment
        self.on_rebalancing = on_rebalancing
        self.client_id = client_id
        self._topics: list[str] = []
        self._wanted: list[str] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._leaving = threading.Event()  # no new subscription once stop() has begun
        self._settled = threading.Event()  # no join under way (set until the first subscribe)
        self._settled.set()
        self._thread = threading.Thread(target=self._run, name="group", daemon=True)
        self.closed = threading.Event()

    def start(self) -> None:
        self._thread.start()

    def subscribe(self, topics: list[str]) -> None:
        with self._lock:
            self._wanted = sorted(topics)

    def stop(self) -> None:
        """Leave the group (a clean close hands partitions over at once). A join under way is
        let finish first: tansu has kept a group's next join waiting for good, for every
        member old and new, when a member left in the middle of one (two nodes started
        together with one id, the newer refusing a moment after it subscribed)."""
        self._leaving.set()
        if self._thread.is_alive() and not self._settled.wait(LEAVE_AFTER_JOIN_SECONDS):
            log.warning("the group join under way did not finish in %.0f s; leaving anyway", LEAVE_AFTER_JOIN_SECONDS)
        self._stop.set()
        self._thread.join(15)

    def _run(self) -> None:
        conf = {**kafka.base_config(self.bootstrap_servers), **GROUP_CONFIG, **self.timings.consumer_config(), "group.id": self.group_id, "client.id": self.client_id}
        consumer = Consumer(conf)

        def assigned(c: Consumer, partitions: list[TopicPartition]) -> None:
            log.info("group assigned %d partitions", len(partitions))
            self._settled.set()
            c.assign(partitions)
            if partitions:
                c.pause(partitions)  # membership only; never fetch here
            self.on_assignment({(tp.topic, tp.partition) for tp in partitions})

        def revoked(c: Consumer, partitions: list[TopicPartition]) -> None:
            self._settled.clear()
            self.on_rebalancing()
            c.unassign()

        def lost(c: Consumer, partitions: list[TopicPartition]) -> None:
            log.warning("group membership lost (session timed out or broker gone); rejoining")
            self._settled.clear()
            self.on_rebalancing()
            c.unassign()

        try:
            while not self._stop.is_set():
                with self._lock:
                    wanted, self._wanted = self._wanted, None
                if wanted is not None and wanted != self._topics and not self._leaving.is_set():
                    self._topics = wanted
                    log.info("subscribing to %s", wanted)
                    if wanted:
                        self._settled.clear()
                        self.on_rebalancing()
                        consumer.subscribe(wanted, on_assign=assigned, on_revoke=revoked, on_lost=lost)
                    else:
                        consumer.unsubscribe()
                        self._settled.set()
                        self.on_assignment(set())
                msg = consumer.poll(0.1)
                if msg is not None and msg.error():
                    if msg.error().code() == KafkaError.INVALID_SESSION_TIMEOUT:
                        self.on_refused(self.timings.refusal())
                    log.info("group consumer: %s", msg.error().str())
        except Exception:  # noqa: BLE001
            log.exception("group member failed")
        finally:
            try:
                consumer.close()
            finally:
                self.closed.set()
