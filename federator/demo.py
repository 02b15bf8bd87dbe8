"""`federator demo`: the main job on embedded defaults.

What runs today: the local broker, a store registered in the catalog, its changelog
written with Kafka's partitioner, shards materialized into RocksDB, and IQv2 queries
against them. Not there yet, and said so when it runs: the Spark jobs, the nodes and SQL.
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import signal
import sys
import time
from pathlib import Path

from federator import kafka
from federator.broker import BrokerError, BrokerProcess
from federator.catalog import Catalog, StoreDefinition, changelog_topic
from federator.node.changelog import catch_up
from federator.partitioner import partition_for
from federator.query import KeyQuery, RangeQuery
from federator.store import Shard

APP = "federator-demo"
PARTITIONS = 8
TEXT = """\
Federator serves SQL over the live state of a data pipeline. A pipeline keeps its results
in partitioned key value stores, one Kafka changelog topic per store and one RocksDB shard
per partition. Federator reads that state live, without copying it into a database: any
node takes SQL, plans it into per partition key and range queries, sends each query to the
node that owns the partition, and merges the Arrow results into one answer.
"""


def step(msg: str) -> None:
    print(f"==> {msg}", flush=True)


def run_demo(args: argparse.Namespace) -> int:
    state = Path(args.dir).resolve()
    if state.exists():
        shutil.rmtree(state)  # the broker keeps nothing across runs, so neither do the shards
    state.mkdir(parents=True)
    log = open(state / "broker.log", "w")
    step(f"starting the local broker on 127.0.0.1:{args.port} (log: {state / 'broker.log'})")
    broker = BrokerProcess("127.0.0.1", args.port, output=log)
    try:
        broker.start()
    except BrokerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    try:
        return _pipeline(broker.bootstrap_servers, state, args)
    finally:
        broker.stop()
        log.close()


def _pipeline(bootstrap: str, state: Path, args: argparse.Namespace) -> int:
    step("the Spark jobs are not built yet (issue 5): counting words in Python instead")
    counts = collections.Counter(w.lower() for w in re.findall(r"[A-Za-z]+", TEXT))

    defn = StoreDefinition.from_dict({
        "name": "word_counts", "type": "kv", "topic": changelog_topic(APP, "word_counts"),
        "partitions": PARTITIONS, "key": {"name": "word", "format": "string"},
        "value": {"name": "count", "format": "long"},
    })
    step(f"registering store {defn.name} in the catalog topic {APP}-catalog")
    Catalog(bootstrap, APP).register(defn)

    step(f"writing {len(counts)} words to {defn.topic} with Kafka's murmur2 partitioner")
    producer = kafka.producer(bootstrap)
    for word, n in counts.items():
        producer.produce(defn.topic, key=defn.key.serialize(word), value=defn.value.serialize(n))
    if producer.flush(30):
        print("error: the broker did not take every record within 30s", file=sys.stderr)
        return 1

    step(f"materializing {PARTITIONS} shards into {state / 'shards'} (the nodes of issue 3 will do this)")
    shards = [Shard(state / "shards" / defn.name / str(p), defn, p) for p in range(PARTITIONS)]
    for s in shards:
        n = catch_up(s, bootstrap)
        print(f"    partition {s.partition}: {n} records, position {s.offset}", flush=True)

    step("asking the shards (IQv2 queries; SQL over HTTP arrives with issue 4)")
    word = "federator"
    p = partition_for(defn.key.serialize(word), PARTITIONS)
    r = shards[p].run(KeyQuery(word))
    print(f"    KeyQuery('{word}') on partition {p}: {r.batch.to_pylist()[0]['count']}")
    top = []
    for s in shards:
        res = s.run(RangeQuery("a", "b", upper_inclusive=False))
        top.extend(res.batch.to_pylist())
    words = sorted(row["word"] for row in top)
    print(f"    RangeQuery('a' <= word < 'b') over all partitions: {', '.join(words)}")
    for s in shards:
        s.close()

    if args.exit:
        step("done (--exit)")
        return 0
    step(f"broker serving at {bootstrap}; shards in {state}. Ctrl-C stops.")
    stop = False

    def on_signal(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while not stop:
        time.sleep(0.2)
    return 0
