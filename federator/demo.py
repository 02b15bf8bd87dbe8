"""`federator demo`: the main job on embedded defaults.

What runs today: the local broker, a store registered in the catalog, its changelog
written with Kafka's partitioner, three nodes that share its partitions (with standby
copies), and SQL over HTTP against them. Not there yet, and said so when it runs: the
Spark jobs (the words are counted in Python).
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import urllib3

from federator import kafka
from federator.broker import BrokerError, BrokerProcess
from federator.catalog import Catalog, StoreDefinition, changelog_topic
from federator.client.sql_cli import format_table

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

    nodes = _start_nodes(bootstrap, state)
    try:
        step("asking the nodes in SQL over HTTP (POST /v1/sql)")
        url = f"http://{nodes[0][1]}"
        for sql in EXAMPLES:
            columns, rows, stats = _sql(url, sql)
            print(f"\n  {sql}")
            print("    " + format_table(columns, rows, stats).replace("\n", "\n    "))
        print(f"\n  try: federator sql --url {url} \"SELECT * FROM word_counts ORDER BY count DESC LIMIT 5\"")
        return _serve_or_exit(args, nodes, url, bootstrap, state)
    finally:
        for proc, _ in nodes:
            proc.terminate()
        for proc, _ in nodes:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()


EXAMPLES = [
    "SELECT word, count FROM word_counts WHERE word = 'federator'",
    "SELECT word, count FROM word_counts ORDER BY count DESC, word LIMIT 5",
    "SELECT COUNT(*) AS words, SUM(count) AS occurrences, MAX(count) AS most FROM word_counts",
    "SELECT LENGTH(word) AS letters, COUNT(*) AS words FROM word_counts GROUP BY LENGTH(word) ORDER BY letters LIMIT 4",
]


def _start_nodes(bootstrap: str, state: Path) -> list[tuple[subprocess.Popen, str]]:
    nodes = []
    for i in range(3):
        port = _free_port()
        endpoint = f"127.0.0.1:{port}"
        log = open(state / f"node{i}.log", "w")
        cmd = [sys.executable, "-m", "federator.cli", "node", "--bootstrap-servers", bootstrap, "--application-id", APP,
               "--listen", endpoint, "--state-dir", str(state / f"node{i}"), "--node-id", f"node{i}",
               "--standby-replicas", "1"]
        nodes.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), endpoint))
        step(f"started node{i} at http://{endpoint} (log: {state / f'node{i}.log'})")
    step("waiting for the nodes to share the partitions and restore their shards")
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        ready = [_ready(ep) for _, ep in nodes]
        if all(ready):
            return nodes
        for proc, ep in nodes:
            if proc.poll() is not None:
                raise RuntimeError(f"the node at {ep} exited with code {proc.returncode}; see its log in {state}")
        time.sleep(0.5)
    raise RuntimeError(f"the nodes were not ready within 90s; see their logs in {state}")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _ready(endpoint: str) -> bool:
    try:
        return urllib3.request("GET", f"http://{endpoint}/readyz", timeout=2).status == 200
    except urllib3.exceptions.HTTPError:
        return False


def _sql(url: str, sql: str) -> tuple[list, list, dict]:
    resp = urllib3.request("POST", f"{url}/v1/sql", json={"sql": sql}, timeout=30)
    body = json.loads(resp.data)
    if resp.status != 200:
        raise RuntimeError(f"{sql}: {body['error']['code']}: {body['error']['message']}")
    return body["columns"], body["rows"], body["stats"]


def _serve_or_exit(args: argparse.Namespace, nodes, url: str, bootstrap: str, state: Path) -> int:
    if args.exit:
        step("done (--exit)")
        return 0
    step(f"serving: SQL at {url}/v1/sql on every node; broker {bootstrap}; state in {state}. Ctrl-C stops.")
    stop = False

    def on_signal(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while not stop:
        time.sleep(0.2)
    return 0
