"""spark.read.format("federator") beside the plain Arrow scan over HTTP that it replaces (issue 20
part 5): the same store read both ways in the same run.

A kv store (string key -> long value) of READ_ROWS rows in 8 partitions on one node (its
records produced here directly, as the sink would write them). Each way is timed over
REPEATS reads after one untimed read (the node's scans then come from its scan cache, for both):
- baseline: ``POST /v1/sql`` ``SELECT * FROM store`` with ``"format": "arrow"``, the answer
  read into a pyarrow Table by this process (one HTTP answer);
- the data source: ``spark.read.format("federator")`` on a local[2] SparkSession, each store
  partition a Spark task reading its owner's internal Arrow endpoint, the rows taken by Spark
  and dropped by the ``noop`` sink (``df.write.format("noop")``, Spark's way to time a read);
- both again with ``value < 1000`` (1,000 rows): in SQL as a WHERE, in Spark as a filter that
  the source hands to the owners.

Nothing is asserted on timings; the figures are appended to tests/bench/results.md.
FEDERATOR_BENCH_READ_ROWS (default 1,000,000) sizes the store.
"""

from __future__ import annotations

import json
import os
import statistics
import time
import uuid

import pyarrow as pa
import pytest
import urllib3

from tests.bench.conftest import Report, progress
from tests.integration.changelog_util import produce, register
from tests.integration.cluster import Cluster

READ_ROWS = int(os.environ.get("FEDERATOR_BENCH_READ_ROWS", 1_000_000))
REPEATS = 3
P = 8
STORE = {"name": "reads", "type": "kv", "partitions": P, "key": {"name": "k", "format": "string"},
         "value": {"name": "value", "format": "long"}}
HTTP = urllib3.PoolManager(retries=False)


def sql_arrow(node, sql: str) -> pa.Table:
    body = json.dumps({"sql": sql, "format": "arrow", "timeout_ms": 120_000}).encode()
    resp = HTTP.request("POST", f"http://{node.endpoint}/v1/sql", body=body,
                        headers={"Content-Type": "application/json"}, timeout=180)
    assert resp.status == 200, resp.data[:500]
    return pa.ipc.open_stream(resp.data).read_all()


def timed(fn) -> tuple[float, object]:
    started = time.perf_counter()
    out = fn()
    return time.perf_counter() - started, out


@pytest.mark.timeout(1800)
def test_spark_read_beside_the_arrow_scan(broker, report: Report, tmp_path) -> None:
    from federator_spark.jobs.common import spark_session
    from federator_spark.source import register as register_source

    app = f"rd{uuid.uuid4().hex[:8]}"
    defn = register(broker, app, STORE)
    progress(f"spark read: producing {READ_ROWS:,} rows")
    for start in range(0, READ_ROWS, 100_000):  # in chunks: the producer's queue holds 100,000
        produce(broker, defn.topic, P, [(k, k, defn.value.serialize(i), 1_700_000_000_000) for i, k in
                                        ((i, f"key-{i:09d}".encode()) for i in range(start, min(READ_ROWS, start + 100_000)))])
    cluster = Cluster(broker.bootstrap_servers, app, tmp_path, size=1, standby_replicas=0)
    cluster.start()
    spark = None
    try:
        cluster.wait_settled("reads", P, timeout=300)
        node = cluster.nodes[0]
        progress("spark read: waiting for every row")
        deadline = time.monotonic() + 300
        while sql_arrow(node, "SELECT COUNT(*) AS n FROM reads").column(0)[0].as_py() < READ_ROWS:
            assert time.monotonic() < deadline, "the node did not materialize every row in 300 s"
            time.sleep(1)
        spark = spark_session("local[2]", "federator-bench-read")
        register_source(spark)
        url = f"http://{node.endpoint}"

        def spark_read(where: str | None) -> None:
            df = spark.read.format("federator").option("url", url).option("store", "reads").load()
            if where is not None:
                df = df.filter(where)
            df.write.format("noop").mode("overwrite").save()

        ways = {
            "plain /v1/sql Arrow scan": lambda: sql_arrow(node, "SELECT * FROM reads").num_rows,
            "spark.read.format(\"federator\")": lambda: spark_read(None),
            "plain /v1/sql, WHERE value < 1000": lambda: sql_arrow(node, "SELECT * FROM reads WHERE value < 1000").num_rows,
            "spark.read.format(\"federator\").filter(\"value < 1000\")": lambda: spark_read("value < 1000"),
        }
        got: dict[str, list[float]] = {}
        for label, fn in ways.items():
            fn()  # untimed: the JVM's code paths, the node's scans kept
            got[label] = []
            for i in range(REPEATS):
                s, out = timed(fn)
                if isinstance(out, int):
                    assert out == (READ_ROWS if "WHERE" not in label else 1000), (label, out)
                got[label].append(s)
                progress(f"spark read: {label} {i + 1}/{REPEATS}: {s:.2f}s")
        counted = spark.read.format("federator").option("url", url).option("store", "reads").load().count()
        assert counted == READ_ROWS, counted
        filtered = (spark.read.format("federator").option("url", url).option("store", "reads").load()
                    .filter("value < 1000").count())
        assert filtered == 1000, filtered
    finally:
        if spark is not None:
            spark.stop()
        cluster.stop()

    def line(label: str, rows: int, base: str) -> str:
        s = statistics.median(got[label])
        ratio = statistics.median(got[base]) / s
        return f"| {label} | {rows:,} | {s:.3f} | {rows / s:,.0f} | {ratio:.2f}x |"

    scan, spark_way = "plain /v1/sql Arrow scan", "spark.read.format(\"federator\")"
    where = "plain /v1/sql, WHERE value < 1000"
    report.section(f"spark.read.format(\"federator\") beside the Arrow scan ({READ_ROWS:,} rows, {P} partitions, "
                   "one node)", [
        f"Medians of {REPEATS} reads after an untimed one (the node's scans kept, for both ways). Spark: local[2], "
        "one task per store partition, each reading its owner's internal Arrow endpoint, rows dropped by the noop "
        "sink; the filter is handed to the owners. SQL: one HTTP answer read into a pyarrow Table by the bench.",
        "", "| read | rows | seconds | rows/s | vs the plain way's rate |", "|---|---:|---:|---:|---:|",
        line(scan, READ_ROWS, scan), line(spark_way, READ_ROWS, scan),
        line(where, 1000, where), line("spark.read.format(\"federator\").filter(\"value < 1000\")", 1000, where)])
