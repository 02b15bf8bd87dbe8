"""What a broker with Apache Kafka's default settings asks of a node: a group session timeout it
accepts (group.min.session.timeout.ms 6000), and one it refuses said so at start."""

from __future__ import annotations

import pytest

from federator.node_command import REFUSED
from tests.integration.changelog_util import register
from tests.integration.cluster import NodeProcess, wait_for

pytestmark = pytest.mark.apache_kafka


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


def test_a_new_node_reads_a_changelog_whose_first_records_were_deleted_from_where_it_starts(apache_kafka, app_id,
                                                                                            tmp_path) -> None:
    """Records before offset 3 deleted (retention, DeleteRecords): a new shard, which asks for
    offset 0 first, is told it is out of range and reads the log from where it starts now."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    from federator import kafka
    from tests.integration.cluster import write_with_token

    defn = register(apache_kafka, app_id, {"name": "cut", "type": "kv", "partitions": 1,
                                           "key": {"format": "string"}, "value": {"format": "long"}})
    for i in range(5):  # one at a time: offsets 0..4
        token = write_with_token(apache_kafka.bootstrap_servers, defn, {f"k{i}": i})
    adm = kafka.admin(apache_kafka.bootstrap_servers)
    # records can be deleted from a topic that is compacted and also deleted, as windowed
    # stores' changelogs are; from a compacted one only, the broker refuses
    policy = ConfigResource("topic", defn.topic, incremental_configs=[
        ConfigEntry("cleanup.policy", "compact,delete", incremental_operation=AlterConfigOpType.SET)])
    next(iter(adm.incremental_alter_configs([policy]).values())).result(30)
    deleted = adm.delete_records([TopicPartition(defn.topic, 0, 3)])
    assert next(iter(deleted.values())).result(30).low_watermark == 3  # the log's new start
    node = NodeProcess(apache_kafka.bootstrap_servers, app_id, "n0", tmp_path / "n0", standby_replicas=0).start()
    try:
        status, body = wait_for(lambda: (answer := node.sql(
            "SELECT key, value FROM cut ORDER BY key", consistency_token=token.to_token(), timeout_ms=30_000)
        )[0] != 503 and answer, 60, "an answer other than 503 (catalog not read, shard not there yet)")
        assert (status, body.get("rows")) == (200, [["k3", 3], ["k4", 4]]), (body, node.log.read_text()[-2000:])
    finally:
        node.stop()


def test_a_long_fetch_wait_costs_a_new_record_nothing_on_apache_kafka(apache_kafka, app_id, tmp_path) -> None:
    """Apache Kafka answers a held fetch the moment a record arrives, so the node's long wait
    (--fetch-wait-ms, which spares an idle broker its empty fetches) does not delay reads of new
    writes. Were the fetch held for the whole wait (as tansu holds it), half the reads below would
    take more than half of it."""
    import statistics
    import time

    from tests.integration.cluster import write_with_token

    wait_ms = 5000
    defn, node, producer = _node_read_back(apache_kafka, app_id, tmp_path, "fresh", 2, "--fetch-wait-ms", wait_ms)
    try:
        took = []
        for i in range(10):
            time.sleep(0.3)  # the node's fetches are held again, with nothing new
            token = write_with_token(apache_kafka.bootstrap_servers, defn, {"k": i}, producer)
            started = time.monotonic()
            status, body = node.sql("SELECT value FROM fresh WHERE key = 'k'", consistency_token=token.to_token(),
                                    timeout_ms=30_000)
            took.append(time.monotonic() - started)
            assert (status, body.get("rows")) == (200, [[i]]), body
        assert statistics.median(took) < wait_ms / 1000 / 4, took
    finally:
        node.stop()


def test_a_read_with_a_token_does_not_wait_out_the_apply_linger(apache_kafka, app_id, tmp_path) -> None:
    """A write fetched soon after the node last applied records gathers for --apply-linger-ms:
    a read without a token does not see it yet, while a read with its token has it applied at
    once. Were the token's read to wait out the linger, it would take seconds."""
    import time

    from tests.integration.cluster import write_with_token

    linger_ms = 4000
    defn, node, producer = _node_read_back(apache_kafka, app_id, tmp_path, "gather", 1, "--apply-linger-ms", linger_ms)
    sql = "SELECT value FROM gather WHERE key = 'k'"
    try:
        for i in range(3):
            applied = time.monotonic()  # at most: the last write was read back with its token
            token = write_with_token(apache_kafka.bootstrap_servers, defn, {"k": i}, producer)
            time.sleep(0.3)  # fetched by now, and gathering
            status, body = node.sql(sql)
            if time.monotonic() - applied < linger_ms / 1000 / 2:
                assert (status, body.get("rows")) == (200, [[i - 1]]), body
            started = time.monotonic()
            status, body = node.sql(sql, consistency_token=token.to_token(), timeout_ms=30_000)
            assert (status, body.get("rows")) == (200, [[i]]), body
            assert time.monotonic() - started < linger_ms / 1000 / 4
    finally:
        node.stop()


def test_a_read_with_a_token_has_only_its_partitions_applied_at_once(apache_kafka, app_id, tmp_path) -> None:
    """Two partitions, a long --apply-linger-ms: a write to one, fetched soon after the last
    apply, gathers; a read with the token of a write to the other has that one applied at once
    and not the first, which is applied when the linger is over. Were every partition applied
    with the token's, the read without a token would see the first write at once. A round
    whose read came too late to tell (a slow machine) is played again."""
    import itertools
    import time

    from federator.partitioner import partition_for
    from tests.integration.cluster import write_with_token

    linger_ms = 4000
    defn, node, producer = _node_read_back(apache_kafka, app_id, tmp_path, "wanted", 2, "--apply-linger-ms", linger_ms)
    bootstrap = apache_kafka.bootstrap_servers
    of_k = partition_for(defn.key.serialize("k"), 2)
    other = next(key for key in (f"o{i}" for i in itertools.count()) if partition_for(defn.key.serialize(key), 2) != of_k)
    sql = "SELECT value FROM wanted WHERE key = 'k'"
    try:
        for first in (10, 20, 30):
            time.sleep(linger_ms / 1000)  # the linger since the last apply is over: the next write is applied as it comes
            written = time.monotonic()  # at most when it was applied, which starts the linger
            write_with_token(bootstrap, defn, {"k": first}, producer)
            wait_for(lambda: node.sql(sql)[1].get("rows") == [[first]], 30, "the first write applied as it came")
            write_with_token(bootstrap, defn, {"k": first + 1}, producer)
            token = write_with_token(bootstrap, defn, {other: first + 2}, producer)
            status, body = node.sql(f"SELECT value FROM wanted WHERE key = '{other}'",
                                    consistency_token=token.to_token(), timeout_ms=30_000)
            assert (status, body.get("rows")) == (200, [[first + 2]]), body
            status, body = node.sql(sql)
            in_time = time.monotonic() - written < 0.8 * linger_ms / 1000
            wait_for(lambda: node.sql(sql)[1].get("rows") == [[first + 1]], 30, "the gathered write applied after the linger")
            if in_time:
                assert (status, body.get("rows")) == (200, [[first]]), body
                return
        pytest.fail(f"no round read the store within the {linger_ms} ms linger of its first write: too slow a machine to tell")
    finally:
        node.stop()


def _node_read_back(apache_kafka, app_id, tmp_path, store: str, partitions: int, flag: str, value: int):
    """A node started with ``flag value`` over a new kv store (string -> long), its key 'k'
    written with -1 and read back with the write's token; (the store, the node, a producer
    that sends each write at once)."""
    from federator import kafka
    from tests.integration.cluster import write_with_token

    defn = register(apache_kafka, app_id, {"name": store, "type": "kv", "partitions": partitions,
                                           "key": {"format": "string"}, "value": {"format": "long"}})
    node = NodeProcess(apache_kafka.bootstrap_servers, app_id, "n0", tmp_path / "n0", standby_replicas=0)
    node.extra_args = [flag, str(value)]
    node.start()
    producer = kafka.producer(apache_kafka.bootstrap_servers, **{"linger.ms": 0})
    try:
        token = write_with_token(apache_kafka.bootstrap_servers, defn, {"k": -1}, producer)
        wait_for(lambda: node.sql(f"SELECT value FROM {store} WHERE key = 'k'", consistency_token=token.to_token(),
                                  timeout_ms=30_000)[0] == 200, 60, "the first write read back")
    except BaseException:
        node.stop()
        raise
    return defn, node, producer
