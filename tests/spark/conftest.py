"""Spark tests: one SparkSession (local[2]) and one "world" for the whole session.

The world writes every store the tests read (through the sink, the jobs in-process and the
word_counts job as a subprocess) and only then starts a two-node cluster, so the nodes join
once and every store is there when they do.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pytest
import urllib3

from tests.integration.cluster import Cluster

P = 4  # partitions of the test stores
EVENTS = 5000
SEED = 7
REPO = Path(__file__).resolve().parents[2]
HTTP = urllib3.PoolManager()
UTC = dt.timezone.utc
T0 = 1_704_067_200_000  # 2024-01-01T00:00:00Z


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from federator_spark.jobs.common import spark_session

    s = spark_session("local[2]", "federator-tests", **{
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.driver.memory": "1g",
    })
    yield s
    s.stop()


# ---- SQL over HTTP ------------------------------------------------------------------------
def sql(node, query: str, token: str | None = None, timeout_ms: int = 30_000) -> pa.Table:
    return sql_with_token(node, query, token, timeout_ms)[0]


def sql_with_token(node, query: str, token: str | None = None, timeout_ms: int = 30_000) -> tuple[pa.Table, str]:
    """The answer, and the consistency token that came with it."""
    body = {"sql": query, "format": "arrow", "consistency_token": token, "timeout_ms": timeout_ms}
    resp = HTTP.request("POST", f"http://{node.endpoint}/v1/sql", body=json.dumps(body).encode(),
                        headers={"Content-Type": "application/json"}, timeout=60)
    assert resp.status == 200, resp.data[:800]
    return pa.ipc.open_stream(resp.data).read_all(), resp.headers["X-Federator-Consistency-Token"]


def explain(world: "World", store: str, token: str | None) -> str:
    """For a read of ``store`` that did not answer what was written: the token's offsets, the
    changelog as the broker serves it, each node's view of the store's partitions, tansu's log."""
    from federator.catalog import changelog_topic
    from federator.query.position import Position
    from tests.conftest import broker_log_tail
    from tests.integration.changelog_util import describe_changelog

    topic = changelog_topic(world.app, store)
    lines = [f"token: {Position.from_token(token).partitions(topic) if token else None}"]
    try:  # what can be told: the failure's own message must not give way to this one's
        lines.append(describe_changelog(world, topic, P))
        for n in world.cluster.running():
            for v in n.metadata()["nodes"]:
                lines.append(f"{n.node_id} sees {v['node_id']}: " + ", ".join(
                    f"{k} {v[k].get(store)}" for k in ("active", "standby", "positions", "lags")))
    except Exception as e:  # noqa: BLE001
        lines.append(f"(could not tell more: {e!r})")
    lines.append(broker_log_tail(world.bootstrap))
    return "\n".join(lines)


def norm(v: Any) -> Any:
    if isinstance(v, dt.datetime):
        return int(v.replace(tzinfo=v.tzinfo or UTC).timestamp() * 1000)
    if isinstance(v, float) and math.isnan(v):
        return "NaN"
    return v


def changelog_records(bootstrap: str, app: str, store: str) -> int:
    """How many records the store's changelog holds, counted by reading them all."""
    from federator import kafka
    from federator.catalog import changelog_topic
    from confluent_kafka import TopicPartition

    topic = changelog_topic(app, store)
    partitions = kafka.topic_partitions(kafka.admin(bootstrap), topic)
    assert partitions, f"no topic {topic}"
    consumer = kafka.reader(bootstrap)
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        count, ended = 0, set()
        while len(ended) < partitions:
            msg = consumer.poll(10)
            assert msg is not None, f"timed out reading {topic}"
            if msg.error():
                assert msg.error().code() == msg.error()._PARTITION_EOF, msg.error()
                ended.add(msg.partition())
            else:
                count += 1
        return count
    finally:
        consumer.close()


def rows(table: pa.Table, columns: list[str] | None = None) -> list[tuple]:
    """Rows as sorted tuples; timestamps as epoch ms."""
    cols = columns or [c for c in table.column_names if c != "rowtime"]
    out = [tuple(norm(r[c]) for c in cols) for r in table.to_pylist()]
    return sorted(out, key=lambda r: tuple((x is None, repr(type(x)), x if x is not None else 0) for x in r))


# ---- the data the world writes ------------------------------------------------------------
STRING_ROWS = [("alpha", "A"), ("Ünïcode ✓", "ü"), ("", "empty key"), ("b", ""), ("x" * 300, "long key")]
LONG_ROWS = [(-(2 ** 63), 1), (-5, -50), (0, 0), (7, 2 ** 62), (2 ** 63 - 1, -(2 ** 63))]
INT_ROWS = [(-(2 ** 31), 2 ** 31 - 1), (-1, -1), (0, 3), (42, -(2 ** 31))]
DOUBLE_ROWS = [(-2.5, 0.1), (1e-300, -1e300), (0.0, float("inf")), (3.25, float("nan")), (1e18, -0.5)]
BYTES_ROWS = [(b"\x00", b"\x00\xff"), (b"\xff\xfe", b""), (b"key", b"value"), (b"\x80" * 9, b"\x01")]
JSON_ROWS = [
    ("p1", "red", 10, 3, 1.5, True, T0 + 1),
    ("p2", None, None, None, None, None, None),
    ("p3", 'quo"te\\ ✓', -(2 ** 62), -7, -0.25, False, T0 + 86_400_000),
    ("p4", "", 0, 0, 1e-7, True, 0),
]
WINDOW_ROWS = [(player, T0 + m * 60_000, i * 10 + m) for i, player in enumerate(["ann", "bob", "cy"]) for m in range(4)]
SESSION_ROWS = [  # key, start, end, games, label
    (1, T0, T0 + 1000, 2, "one"),
    (1, T0 + 3_600_000, T0 + 3_600_000, 1, "one again"),
    (-3, T0 + 5, T0 + 900_000, 5, None),
    (2 ** 40, T0, T0 + 60_000, 3, "big"),
]
REPLACE_KV = [(f"k{i:02d}", i) for i in range(10)]
REPLACE_WIN = [(p, T0 + m * 60_000, m) for p in ("a", "b") for m in range(4)]
RYW_ROWS = [(f"r{i}", 1) for i in range(20)]


@dataclass
class World:
    app: str
    bootstrap: str
    cluster: Cluster
    game_input: Path
    text_input: Path
    tokens: dict[str, str] = field(default_factory=dict)
    frames: dict[str, Any] = field(default_factory=dict)
    cli_output: str = ""

    @property
    def bootstrap_servers(self) -> str:  # what tests.integration.changelog_util expects of a broker
        return self.bootstrap

    @property
    def node(self):
        return self.cluster.nodes[0]

    def write(self, name: str, df: Any = None, **overrides: Any) -> str:
        """Write ``df`` (default: the DataFrame the world wrote) with the store's arguments."""
        from federator_spark.sink import write_store

        first, kw = self.frames[name]
        return write_store(first if df is None else df, name, bootstrap_servers=self.bootstrap,
                           application_id=self.app, partitions=P, **{**kw, **overrides})


def frames(spark) -> dict[str, Any]:
    """name -> (DataFrame, write_store arguments)."""
    from pyspark.sql import functions as F

    def ms_ts(df, *cols):
        for c in cols:
            df = df.withColumn(c, F.timestamp_millis(F.col(c)))
        return df

    return {
        "rt_string": (spark.createDataFrame(STRING_ROWS, "name string, label string"),
                      dict(key="name", value="label")),
        "rt_long": (spark.createDataFrame(LONG_ROWS, "id long, amount long"), dict(key="id", value="amount")),
        "rt_int": (spark.createDataFrame(INT_ROWS, "id int, n int"), dict(key="id")),  # value=None: the other column
        "rt_double": (spark.createDataFrame(DOUBLE_ROWS, "x double, y double"), dict(key="x", value="y")),
        "rt_bytes": (spark.createDataFrame(BYTES_ROWS, "k binary, b binary"), dict(key="k", value="b")),
        "rt_json": (ms_ts(spark.createDataFrame(JSON_ROWS, "player string, team string, score long, level int, "
                                                           "ratio double, active boolean, seen long"), "seen"),
                    dict(key="player", value=["team", "score", "level", "ratio", "active", "seen"])),
        "rt_window": (ms_ts(spark.createDataFrame(WINDOW_ROWS, "player string, start long, points long"), "start"),
                      dict(key="player", value="points", type="window", window_start="start", window_size_ms=60_000)),
        "rt_session": (spark.createDataFrame(SESSION_ROWS, "id long, s long, e long, games long, label string"),
                       dict(key="id", value=["games", "label"], type="session", session_start="s", session_end="e")),
        "replace_kv": (spark.createDataFrame(REPLACE_KV, "k string, v long"), dict(key="k", value="v")),
        "replace_win": (spark.createDataFrame(REPLACE_WIN, "k string, ws long, v long"),
                        dict(key="k", value="v", type="window", window_start="ws", window_size_ms=60_000)),
        "ryw": (spark.createDataFrame(RYW_ROWS, "k string, v long"), dict(key="k", value="v")),
    }


TEXT = "The quick brown fox; the LAZY dog.\nÉtude über alles -- the end_of it, 42 times!\n"


def run_word_counts(bootstrap: str, app: str, text: Path) -> subprocess.Popen:
    """The word_counts job as a user runs it, in its own process (its output: stdout)."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    return subprocess.Popen(
        [sys.executable, "-m", "federator_spark.jobs.word_counts", "--bootstrap-servers", bootstrap,
         "--application-id", app, "--input", str(text), "--master", "local[1]", "--partitions", str(P)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


@pytest.fixture(scope="session")
def world(broker, spark, tmp_path_factory) -> Iterator[World]:
    from federator_spark.jobs import game_events
    root = tmp_path_factory.mktemp("spark-world")
    app = f"sp{uuid.uuid4().hex[:8]}"
    text = root / "text.txt"
    text.write_text(TEXT, encoding="utf-8")
    cli = run_word_counts(broker.bootstrap_servers, app, text)  # alongside the in-process writes
    w = World(app, broker.bootstrap_servers, Cluster(broker.bootstrap_servers, app, root / "nodes", size=2,
                                                      standby_replicas=0), root / "events", text)
    try:
        for name, (df, kw) in frames(spark).items():
            w.frames[name] = (df, kw)
            w.tokens[name] = w.write(name)
        w.tokens.update(game_events.run(spark, w.bootstrap, app, str(w.game_input), EVENTS, SEED, partitions=P))
        out, _ = cli.communicate(timeout=240)
        w.cli_output = out
        assert cli.returncode == 0, out[-3000:]
        w.tokens["word_counts"] = out.strip().splitlines()[-1].split("consistency token: ")[-1]
        w.cluster.start()
        for store in w.tokens:
            w.cluster.wait_settled(store, P, timeout=90)
        yield w
    finally:
        if cli.poll() is None:
            cli.kill()
        w.cluster.stop()
