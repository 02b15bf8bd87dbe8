"""Hunting the lost record: write the sink's round-trip store again and again while two nodes
take each new store's partitions in a rebalance, and read each write back with its token.

    python -m tests.spark.lost_record tansu|kafka [ROUNDS] [cold|changelogs|race]

``cold``: as the Spark tests' world does, each round writes a store of a new application first,
then starts its two nodes and reads once they have settled.

Prints each round's outcome and, for an answer that lacks a written row, the changelog's
records, the answering node's positions and its log lines about that partition.

``changelogs``: no nodes; each round writes every store the Spark tests' world writes (its
DataFrames, the word_counts job running beside as the world runs it) for a new application,
then reads each changelog partition as a new shard would from the log's beginning
(OFFSET_BEGINNING) and from offset 0, and says where they differ, with the broker's
ListOffsets answers. Set RUST_LOG (e.g. tansu_storage=debug) for tansu's log.

``race``: tansu only; each round two producers write one record to each partition of a new
store's changelog at once (tests/spark/tansu_log_start.py), until a partition's ListOffsets
EARLIEST is past its first record; then a new node reads the store with the writes' token and
must count every record. (Run the nodes of older code by putting its checkout first on
PYTHONPATH.) CPU load beside it and RUST_LOG=tansu_storage::dynostore=debug make the race likelier.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
import uuid
from pathlib import Path

import urllib3

from federator.query.position import Position
from tests.conftest import RunningBroker, free_port
from tests.integration.changelog_util import read_partition
from tests.integration.cluster import Cluster
from tests.spark.conftest import STRING_ROWS

HTTP = urllib3.PoolManager()


def ask(node, sql: str, token: str, deadline: float) -> tuple[int, dict]:
    while True:
        resp = HTTP.request("POST", f"http://{node.endpoint}/v1/sql", json={"sql": sql, "consistency_token": token,
                                                                           "timeout_ms": 20_000}, timeout=60)
        body = json.loads(resp.data)
        if resp.status in (409, 503, 504) and time.monotonic() < deadline:
            time.sleep(0.2)
            continue
        return resp.status, body


def start_broker(kind: str, root: Path):
    if kind == "kafka":
        from tests.apache_kafka import KafkaCluster

        return KafkaCluster(root / "kafka").start()
    broker = RunningBroker(free_port())
    print("tansu's log:", broker.log, flush=True)
    return broker


def main(kind: str, rounds: int, cold: bool) -> int:
    from federator_spark.jobs.common import spark_session
    from federator_spark.sink import write_store

    root = Path(tempfile.mkdtemp(prefix="lost-"))
    broker = start_broker(kind, root)
    spark = spark_session("local[2]", "lost-record", **{"spark.sql.shuffle.partitions": "2"})
    app = f"lr{uuid.uuid4().hex[:6]}"
    cluster = None if cold else Cluster(broker.bootstrap_servers, app, root / "nodes", size=2, standby_replicas=0).start()
    df = spark.createDataFrame(STRING_ROWS, "name string, label string")
    want = sorted(STRING_ROWS)
    lost = 0
    try:
        for i in range(rounds):
            store = f"rt{i}"
            if cold:
                app = f"lr{uuid.uuid4().hex[:6]}"
            token = write_store(df, store, key="name", value="label", bootstrap_servers=broker.bootstrap_servers,
                                application_id=app, partitions=4)
            if cold:
                if cluster is not None:
                    cluster.stop()
                cluster = Cluster(broker.bootstrap_servers, app, root / f"nodes{i}", size=2, standby_replicas=0).start()
                cluster.wait_settled(store, 4, timeout=60)
            node = cluster.nodes[i % 2]
            status, body = ask(node, f"SELECT * FROM {store}", token, time.monotonic() + 60)
            got = sorted(tuple(r) for r in body.get("rows", []))
            ok = status == 200 and got == want
            print(f"round {i}: {status} {'ok' if ok else 'WRONG'} {len(got)} rows", flush=True)
            if not ok:
                lost += 1
                report(broker, app, store, token, body, want, got, node)
    finally:
        if cluster is not None:
            cluster.stop()
        spark.stop()
        broker.stop()
    print(f"{lost} wrong of {rounds} rounds on {kind}")
    return 1 if lost else 0


def report(broker, app, store, token, body, want, got, node) -> None:
    topic = f"{app}-{store}-changelog"
    print("  token", Position.from_token(token), "answer", body.get("error") or body.get("stats"))
    print("  missing", sorted(set(want) - set(got)))
    for p in range(4):
        print(f"  {topic}[{p}]", [(o, k, v) for o, k, v, _ in read_partition(broker, topic, p)])
    for line in node.log.read_text().splitlines():
        if store in line:
            print("  log:", line[:300])


def changelog_rounds(kind: str, rounds: int) -> int:
    from federator_spark.jobs.common import spark_session
    from federator_spark.sink import write_store
    from tests.spark.conftest import frames, run_word_counts

    spark = spark_session("local[2]", "lost-record", **{"spark.sql.shuffle.partitions": "2",
                                                          "spark.default.parallelism": "2"})
    stores = frames(spark)
    root = Path(tempfile.mkdtemp(prefix="lost-"))
    broker = start_broker(kind, root)
    text = root / "text.txt"
    text.write_text("the quick brown fox\nthe lazy dog\n" * 20)
    wrong = 0
    try:
        for i in range(rounds):
            app = f"lr{uuid.uuid4().hex[:6]}"
            cli = run_word_counts(broker.bootstrap_servers, app, text)
            for name, (df, kw) in stores.items():
                write_store(df, name, bootstrap_servers=broker.bootstrap_servers, application_id=app, partitions=4, **kw)
            out, _ = cli.communicate(timeout=240)
            assert cli.returncode == 0, out[-2000:]
            bad = [line for name in [*stores, "word_counts"] for line in beginning_differs(broker, f"{app}-{name}-changelog", 4)]
            wrong += bool(bad)
            print(f"round {i} ({app}): {len(bad)} partitions read from the beginning lack records", flush=True)
            for line in bad:
                print("  " + line, flush=True)
    finally:
        spark.stop()
        broker.stop()
    print(f"{wrong} of {rounds} rounds had a changelog partition whose beginning lacks records")
    return 1 if wrong else 0


def beginning_differs(broker, topic: str, partitions: int) -> list[str]:
    """The partitions of ``topic`` whose records read from OFFSET_BEGINNING are not all those read
    from offset 0, or whose offsets have holes: each with the broker's ListOffsets answers."""
    from confluent_kafka import OFFSET_BEGINNING

    from tests.integration.changelog_util import describe_changelog
    from tests.spark.tansu_log_start import offsets_read

    out = []
    for p in range(partitions):
        offsets = offsets_read(broker.bootstrap_servers, topic, p, 0)
        seen = offsets_read(broker.bootstrap_servers, topic, p, OFFSET_BEGINNING)
        if seen != offsets or offsets != list(range(len(offsets))):
            out.append(f"{topic}[{p}] from offset 0: {offsets}, from the beginning: {seen}")
    if out:
        out.append(describe_changelog(broker, topic, partitions))
    return out


def race_rounds(rounds: int, partitions: int = 128) -> int:
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import OffsetSpec

    from federator import kafka
    from tests.integration.changelog_util import register
    from tests.integration.cluster import NodeProcess, wait_for
    from tests.spark.tansu_log_start import WRITERS, race

    broker = start_broker("tansu", Path(tempfile.mkdtemp(prefix="lost-")))
    adm = kafka.admin(broker.bootstrap_servers)
    try:
        for i in range(rounds):
            app = f"lr{uuid.uuid4().hex[:6]}"
            defn = register(broker, app, {"name": "race", "type": "kv", "partitions": partitions,
                                          "key": {"format": "string"}, "value": {"format": "string"}})
            race(broker.bootstrap_servers, defn.topic, partitions)
            tps = [TopicPartition(defn.topic, p) for p in range(partitions)]
            earliest = adm.list_offsets({tp: OffsetSpec.earliest() for tp in tps})
            wrong = [tp.partition for tp in tps if earliest[tp].result(10).offset != 0]
            print(f"round {i} ({app}): partitions whose EARLIEST is past their first record: {wrong}", flush=True)
            if wrong:
                break
        else:
            return 0
        token = Position({defn.topic: {p: WRITERS - 1 for p in range(partitions)}}).to_token()
        node = NodeProcess(broker.bootstrap_servers, app, "n0", Path(tempfile.mkdtemp(prefix="lost-node-")),
                           standby_replicas=0).start()
        try:
            status, body = wait_for(lambda: (a := node.sql("SELECT COUNT(*) FROM race", consistency_token=token,
                                                           timeout_ms=30_000))[0] != 503 and a, 120, "an answer")
        finally:
            node.stop()
        print(f"a new node counts {body.get('rows')} records with the token ({status}); written: "
              f"{WRITERS * partitions}", flush=True)
        return 0 if body.get("rows") == [[WRITERS * partitions]] else 1
    finally:
        broker.stop()


if __name__ == "__main__":
    kind_, rounds_, mode = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 30, sys.argv[3:]
    if mode == ["race"]:
        sys.exit(race_rounds(rounds_))
    sys.exit(changelog_rounds(kind_, rounds_) if mode == ["changelogs"] else main(kind_, rounds_, mode == ["cold"]))
