"""Spark sink throughput on a real broker, beside a plain confluent-kafka producer from the same run.

(a) A plain producer loop (``federator.kafka.producer``: murmur2_random, idempotent) writes N
    records (40-byte string keys, 8-byte long values) to an 8-partition topic.
(b) ``spark.sink.write_store`` from a local[2] SparkSession writes a DataFrame of the same N rows
    (key string, value long) as a kv store with 8 partitions. Timed end to end (the call), and
    the produce phase on its own (from the progress line that closes the data checks to the line
    that reports the records written).

Nothing here asserts on timings: the rates and where each target stands are printed and written
to tests/bench/results_sink.md (test_bench_sql.py's results.md is left alone). Run with
``.venv/bin/python -m pytest tests/bench/test_bench_sink.py -s -q``; FEDERATOR_BENCH_SINK_ROWS
shrinks N for a quick look.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import struct
import time
import uuid
from pathlib import Path

import pytest

from federator import kafka
from federator.query.position import Position
from tests.bench.conftest import Report, progress

# ---- sizes (constants; the env override is for quick looks) ------------------------------------
N = int(os.environ.get("FEDERATOR_BENCH_SINK_ROWS", 200_000))  # records written by each side
PARTITIONS = 8
WARMUP_ROWS = 10_000  # a first, untimed write_store: JVM/JIT, Python workers and their producer
KEY_FORMAT = "bench-sink-key-%025d"  # 40 bytes
# write_store's own producer settings (spark/sink.py), so both sides produce alike
PRODUCER_CONFIG = {"linger.ms": 20, "batch.size": 1_000_000, "queue.buffering.max.messages": 500_000}

# ---- targets (reported, never asserted) ------------------------------------------------------
T_SINK_RATE = 200_000  # records/s through write_store
T_SINK_FRACTION = 0.5  # write_store >= half the plain producer's rate

RESULTS_MD = Path(__file__).with_name("results_sink.md")


def key_of(i: int) -> str:
    return KEY_FORMAT % i


def plain_produce(bootstrap: str, topic: str, n: int) -> tuple[float, float]:
    """n records key_of(i) -> long i*7; returns (seconds in the produce loop, seconds incl. flush)."""
    p = kafka.producer(bootstrap, **PRODUCER_CONFIG)
    produce, poll = p.produce, p.poll
    pack = struct.Struct(">q").pack
    keys = [key_of(i).encode() for i in range(n)]  # built outside the timing, as Spark's rows are
    values = [pack(i * 7) for i in range(n)]
    step = max(1, n // 4)
    started = time.perf_counter()
    for i in range(n):
        try:
            produce(topic, values[i], keys[i])
        except BufferError:
            while True:
                poll(0.05)
                try:
                    produce(topic, values[i], keys[i])
                    break
                except BufferError:
                    continue
        if i % 10_000 == 0:
            poll(0)
        if i and i % step == 0:
            progress(f"  plain: produced {i:,} / {n:,}")
    loop = time.perf_counter() - started
    left = p.flush(120)
    total = time.perf_counter() - started
    assert left == 0, f"{left} records not delivered"
    return loop, total


def render(report: Report) -> str:
    out = [
        "# Federator benchmarks: Spark sink",
        "",
        f"Run {dt.datetime.now():%Y-%m-%d %H:%M}, Python {platform.python_version()} on {platform.machine()}, "
        f"{os.cpu_count()} cores. Broker, Spark (local[2]) and the plain producer all share this machine.",
        "",
        "## Targets (reported, never asserted)", "", "| target | measured | |", "|---|---|---|",
        *(f"| {t} | {m} | {v} |" for t, m, v in report.targets), "",
    ]
    for title, lines in report.sections:
        out += [f"## {title}", "", *lines, ""]
    if report.notes:
        out += ["## Notes", "", *(f"- {n}" for n in report.notes), ""]
    return "\n".join(out)


@pytest.mark.timeout(900)
def test_sink_vs_plain_producer(broker) -> None:
    from pyspark.sql import functions as F

    from spark.jobs.common import spark_session
    from spark.sink import write_store

    report = Report()
    bootstrap = broker.bootstrap_servers
    app_id = f"bk{uuid.uuid4().hex[:8]}"

    # ---- (a) plain confluent-kafka producer ---------------------------------------------------
    topic = f"bench-plain-{uuid.uuid4().hex[:8]}"
    kafka.ensure_topic(kafka.admin(bootstrap), topic, PARTITIONS)
    progress(f"plain producer: {N:,} records into {topic} ({PARTITIONS} partitions)")
    plain_loop, plain_s = plain_produce(bootstrap, topic, N)
    plain_rate = N / plain_s
    progress(f"plain producer: {plain_s:.2f}s incl. flush ({plain_rate:,.0f} records/s; "
             f"produce loop {plain_loop:.2f}s)")

    # ---- (b) write_store from local[2] --------------------------------------------------------
    progress("starting SparkSession local[2]")
    t0 = time.perf_counter()
    spark = spark_session("local[2]", "federator-bench-sink")
    progress(f"SparkSession up in {time.perf_counter() - t0:.1f}s")
    try:
        def frame(n: int):
            return spark.range(n).select(F.format_string(KEY_FORMAT, F.col("id")).alias("key"),
                                         (F.col("id") * 7).alias("value"))

        events: list[tuple[float, str]] = []

        def say(msg: str) -> None:
            events.append((time.perf_counter(), msg))
            progress(f"  sink: {msg}")

        progress(f"warm-up: write_store of {WARMUP_ROWS:,} rows (untimed)")
        t0 = time.perf_counter()
        write_store(frame(WARMUP_ROWS), "warmup", key="key", value="value", partitions=PARTITIONS,
                    bootstrap_servers=bootstrap, application_id=app_id, progress=say)
        progress(f"warm-up done in {time.perf_counter() - t0:.1f}s")

        df = frame(N)
        assert df.schema["key"].dataType.typeName() == "string" and df.schema["value"].dataType.typeName() == "long"
        events.clear()
        progress(f"write_store: {N:,} rows as kv store 'bench' ({PARTITIONS} partitions)")
        started = time.perf_counter()
        token = write_store(df, "bench", key="key", value="value", partitions=PARTITIONS,
                            bootstrap_servers=bootstrap, application_id=app_id, progress=say)
        sink_s = time.perf_counter() - started
    finally:
        spark.stop()

    written = sum(o + 1 for _t, _p, o in Position.from_token(token))
    assert written == N, f"the changelog holds {written} records after the write, not {N}"
    sink_rate = N / sink_s
    wrote_at = next(t for t, m in events if " wrote " in m)
    before = [t for t, m in events if t < wrote_at]  # "rows checked" / "registered": the write starts right after
    produce_s = wrote_at - before[-1] if before else None
    checks_s = next((t for t, m in events if "rows checked" in m), started) - started
    produce_rate = N / produce_s if produce_s else None
    progress(f"write_store: {sink_s:.2f}s end to end ({sink_rate:,.0f} records/s); checks {checks_s:.2f}s, "
             f"produce phase {produce_s:.2f}s ({produce_rate:,.0f} records/s)" if produce_s else
             f"write_store: {sink_s:.2f}s end to end ({sink_rate:,.0f} records/s)")

    ratio = sink_rate / plain_rate
    produce_ratio = produce_rate / plain_rate if produce_rate else None
    rows = [
        "| measurement | seconds | records/s | vs plain producer |",
        "|---|---:|---:|---:|",
        f"| plain confluent-kafka producer loop, incl. flush (1 Python thread) | {plain_s:.2f} | {plain_rate:,.0f} | 1.00x |",
        f"| write_store end to end (checks + register + produce), local[2] | {sink_s:.2f} | {sink_rate:,.0f} | {ratio:.2f}x |",
    ]
    if produce_s:
        rows += [
            f"| - of which the data checks (group-by job) | {checks_s:.2f} | | |",
            f"| - of which the produce phase (mapInArrow job, incl. flush) | {produce_s:.2f} | {produce_rate:,.0f} | "
            f"{produce_ratio:.2f}x |",
        ]
    report.section(f"write_store vs a plain producer ({N:,} records, 40-byte string keys, long values, "
                   f"{PARTITIONS} partitions)", [
        "Same broker, same run, fresh topics. Both use federator.kafka.producer (murmur2_random, idempotent) "
        f"with write_store's settings {PRODUCER_CONFIG}. The plain loop's keys/values are built before timing; "
        f"write_store is timed around the call after an untimed {WARMUP_ROWS:,}-row warm-up write "
        "(JVM, Python workers).", "", *rows])
    report.target(f"write_store >= {T_SINK_RATE:,} records/s",
                  f"{sink_rate:,.0f} records/s end to end"
                  + (f" (produce phase {produce_rate:,.0f})" if produce_rate else ""), sink_rate >= T_SINK_RATE)
    report.target(f"write_store >= {T_SINK_FRACTION:.0%} of the plain producer's rate",
                  f"{sink_rate:,.0f} vs {plain_rate:,.0f} = {ratio:.0%} end to end"
                  + (f" (produce phase {produce_ratio:.0%})" if produce_ratio else ""), ratio >= T_SINK_FRACTION)
    text = render(report)
    RESULTS_MD.write_text(text)
    print("\n" + text + f"\n(written to {RESULTS_MD})", flush=True)
