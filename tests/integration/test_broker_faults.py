"""Broker faults: three Apache Kafka brokers (every changelog replicated three times,
min.insync.replicas 2), three nodes with a standby copy each, the kill test's writer upserting
keys and its readers reading with the writer's consistency tokens, while the broker that leads
a changelog partition is stopped and started again: once shut down in order (SIGTERM, leadership
handed over first) and once crashed (SIGKILL).

The oracle is the kill test's (tests/integration/test_chaos.py): every answer names the write it
comes from, and must be no older than the token's. Asserted: no wrong answer, no silent partial
answer, no 5xx but the retryable 503 (which must name the partitions it lacks), and at the end
every acknowledged write read back with the final token: no record lost in any shard.

A long run (three brokers, each fault a broker's stop and start): `make broker-faults` runs it.
"""

from __future__ import annotations

import os
import random
import re
import signal
import time

import pytest

from tests.apache_kafka import KafkaCluster
from tests.integration.changelog_util import register
from tests.integration.cluster import Cluster, wait_for
from tests.integration.test_chaos import READERS, Chaos, Writer
from tests.threads import Worker, join_all

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not os.environ.get("FEDERATOR_BROKER_FAULTS"), reason="a long run: make broker-faults")]
P = 6
KEYS = 300


def _reads_flow(chaos: Chaos, threads: list[Worker], what: str, more: int = 50) -> None:
    seen = chaos.answered()
    wait_for(lambda: chaos.answered() >= seen + more or not all(t.is_alive() for t in threads), 60, what)
    if not all(t.is_alive() for t in threads):
        join_all([t for t in threads if not t.is_alive()], 0)
        raise AssertionError(f"{[t.name for t in threads if not t.is_alive()]} stopped")


def test_a_changelog_leader_stopped_and_started_loses_nothing(apache_kafka3: KafkaCluster, app_id, tmp_path) -> None:
    kafka = apache_kafka3
    bootstrap = kafka.bootstrap_servers
    defn = register(kafka, app_id, {"name": "chaos", "type": "kv", "partitions": P, "key": {"format": "string"},
                                     "value": {"format": "long"}})
    keys = [f"key-{i:05d}" for i in range(KEYS)]
    writer = Writer(bootstrap, defn, keys)
    writer.write(keys)
    cluster = Cluster(bootstrap, app_id, tmp_path / "nodes", size=3, standby_replicas=1).start()
    chaos = Chaos(cluster, writer, keys)
    threads = [Worker(writer.run, name="writer")] + [Worker(chaos.reader, i, name=f"reader{i}") for i in range(READERS)]
    faults: list[tuple[str, int]] = []
    rnd = random.Random(5)
    try:
        cluster.wait_settled("chaos", P, timeout=90)
        for t in threads:
            t.start()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            _reads_flow(chaos, threads, "reads to flow with every broker up")
            partition = rnd.randrange(P)
            leader = kafka.leader(defn.topic, partition)
            assert leader >= 0, f"{defn.topic}[{partition}] has no leader with every broker up"
            faults.append((signal.Signals(sig).name, kafka.nodes[leader].node_id))
            kafka.stop_broker(leader, sig)
            wait_for(lambda: kafka.leader(defn.topic, partition) not in (-1, leader), 60,
                     f"a new leader of {defn.topic}[{partition}]")
            _reads_flow(chaos, threads, f"reads to flow with broker {kafka.nodes[leader].node_id} down")
            kafka.start_broker(leader)
            _reads_flow(chaos, threads, f"reads to flow after broker {kafka.nodes[leader].node_id} came back")
        cluster.wait_settled("chaos", P, timeout=90)
    finally:
        writer.stop.set()
        chaos.stop.set()
        join_all(threads, 90)
    token, acked = writer.token()
    try:
        status, body = cluster.nodes[0].sql("SELECT key, value FROM chaos", consistency_token=token, timeout_ms=30_000)
    finally:
        cluster.stop()
    t = chaos.tally
    print(f"\nbroker faults {faults}: {writer.writes} writes, {sum(t.reads.values())} reads answered "
          f"({dict(t.reads)}), retried {dict(t.retried)}; wrong {len(t.wrong)}, partial {len(t.partial)}, "
          f"5xx {t.fivexx}, errors {len(t.errors)}")
    assert status == 200, body
    lost = {k: v for k, v in acked.items() if dict(body["rows"]).get(k) != v}
    assert not lost, f"{len(lost)} acknowledged writes not read back with the final token: {list(lost.items())[:5]}"
    assert not t.wrong, t.wrong[:5]
    assert not t.partial, t.partial[:5]
    assert t.fivexx == 0 and not t.errors, t.errors[:5]
    for message in t.why.get(503, []):  # a refusal says which partitions it lacks
        assert re.search(r"partition", message), message
    assert all(t.reads[k] > 0 for k in ("point", "count", "scan")), t.reads


def test_admin_requests_find_another_controller_when_theirs_stops(apache_kafka3: KafkaCluster) -> None:
    """A node's changelog checks are admin requests, sent to the broker its client takes for the
    controller: when that broker stops they must reach another one within seconds."""
    from confluent_kafka import TopicCollection
    from confluent_kafka.admin import NewTopic

    from federator import kafka as clients

    kafka = apache_kafka3
    topic = f"ctl-{random.randrange(10**9)}"
    adm = clients.admin(kafka.bootstrap_servers)
    adm.create_topics([NewTopic(topic, 1, 3)])[topic].result(30)
    assert clients.topic_id(adm, topic) is not None
    controller = adm.list_topics(timeout=10).controller_id
    index = next(i for i, n in enumerate(kafka.nodes) if n.node_id == controller)
    kafka.stop_broker(index, signal.SIGKILL)
    try:
        started = time.monotonic()
        def answered() -> bool:
            try:
                return clients.topic_id(adm, topic, timeout=3) is not None
            except clients.KafkaUnavailable:
                return False
        wait_for(answered, 30, f"an admin request with broker {controller} (its controller) down")
        print(f"\nadmin requests answered again {time.monotonic() - started:.1f} s after the controller stopped")
    finally:
        kafka.start_broker(index)
