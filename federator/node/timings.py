"""How a node keeps its place in the consumer group: settings only, no Kafka client, so that
`federator --help` shows their defaults in an install without the node's dependencies."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from federator.settings import NodeSettings


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
