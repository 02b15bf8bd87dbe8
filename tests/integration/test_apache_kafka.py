"""What a broker with Apache Kafka's default settings asks of a node: a group session timeout it
accepts (group.min.session.timeout.ms 6000), and one it refuses said so at start."""

from __future__ import annotations

from federator.node_command import REFUSED
from tests.integration.changelog_util import register
from tests.integration.cluster import NodeProcess


def test_a_session_timeout_the_broker_refuses_stops_the_node_and_says_which_flag(apache_kafka, app_id, tmp_path) -> None:
    register(apache_kafka, app_id, {"name": "st", "type": "kv", "partitions": 2,
                                    "key": {"format": "string"}, "value": {"format": "long"}})
    node = NodeProcess(apache_kafka.bootstrap_servers, app_id, "n0", tmp_path / "n0", standby_replicas=0)
    node.extra_args = ["--session-timeout-ms", "3000", "--heartbeat-interval-ms", "500"]
    node.start(wait=False)
    assert node.proc.wait(60) == REFUSED, node.log.read_text()[-2000:]
    text = node.log.read_text()
    assert "refused the group session timeout of 3000 ms (INVALID_SESSION_TIMEOUT)" in text, text[-2000:]
    assert "set --session-timeout-ms within them" in text
