"""Spark sink throughput on a real broker, beside a plain confluent-kafka producer from the same run.

(a) A plain producer loop (``federator.kafka.producer``: murmur2_random, idempotent) writes N
    records (40-byte string keys, 8-byte long values) to an 8-partition topic.
(b) ``federator_spark.sink.write_store`` from a local[2] SparkSession writes a DataFrame of the same N rows
    (key string, value long) as a new kv store with 8 partitions, twice per round:
    - input materialized: the DataFrame is cached and counted before the timer starts, as the
      plain loop's keys and values are built before its timer starts. This is the sink's own
      rate, and the targets are judged on it.
    - input computed: the DataFrame (``format_string`` keys) is computed inside the timing, by
      both passes. The difference is what the user's own DataFrame costs the sink's two passes.
    Each is timed end to end (the call), and by phase from its progress lines: checks (pass 1:
    Spark computes the rows' checks and key hashes, the driver sorts the hashes), registration,
    produce (pass 2: the rows read again, serialized and produced, incl. flush).

Each size runs REPS rounds of (a) then both (b), so all sides see the same noise; the table gives
medians, and the first round of (b) on its own (the JVM still compiling Spark's code paths for
that size), and the CPU seconds each side used by process (the machine has 2 cores: the sum
over 2 bounds the time). Nothing here asserts on timings: the rates and where each target stands are printed
and appended to tests/bench/results_sink.md, after the runs before it (test_bench_sql.py's results.md is left alone). Run
with ``.venv/bin/python -m pytest tests/bench/test_bench_sink.py -s -q``;
FEDERATOR_BENCH_SINK_ROWS (e.g. "20000" or "20000,50000") picks other sizes for a quick look.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import statistics
import struct
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from federator import kafka
from federator.query.position import Position
from tests.bench.conftest import Report, progress

# ---- sizes (constants; the env override is for quick looks) ------------------------------------
SIZES = [int(s) for s in os.environ.get("FEDERATOR_BENCH_SINK_ROWS", "200000,1000000").split(",")]
REPS = 3  # rounds per size: plain producer, then write_store
PARTITIONS = 8
WARMUP_ROWS = 10_000  # a first, untimed write_store and format write: JVM, Python workers and their producers
KEY_FORMAT = "bench-sink-key-%025d"  # 40 bytes

# ---- targets (reported, never asserted) ------------------------------------------------------
T_SINK_RATE = 200_000  # records/s through write_store
T_SINK_FRACTION = 0.5  # write_store >= half the plain producer's rate

RESULTS_MD = Path(__file__).with_name("results_sink.md")


def key_of(i: int) -> str:
    return KEY_FORMAT % i


def plain_produce(bootstrap: str, topic: str, n: int, config: dict) -> float:
    """n records key_of(i) -> long i*7 (after one untimed record); the seconds of the loop incl. flush."""
    p = kafka.producer(bootstrap, **config)
    # warm, like write_store's producers after the warm-up: an idempotent producer's first
    # delivery waits for its producer id (up to ~0.5 s here)
    p.produce(topic, b"", b"warm-up", 0)
    assert p.flush(30) == 0
    produce, poll = p.produce, p.poll
    pack = struct.Struct(">q").pack
    keys = [key_of(i).encode() for i in range(n)]  # built outside the timing, as Spark's rows are
    values = [pack(i * 7) for i in range(n)]
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
    left = p.flush(120)
    took = time.perf_counter() - started
    assert left == 0, f"{left} records not delivered"
    return took


def cpu_seconds(broker_pid: int) -> dict[str, float]:
    """CPU seconds used so far (Linux /proc; empty elsewhere) by this process (the driver, or the
    plain loop), its child processes (Spark's JVM and its Python workers) and the broker's
    process tree. Exited processes are not counted: Spark keeps its workers for the session."""
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    procs: dict[int, tuple[int, float]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return {}
    for name in names:
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()  # after "pid (comm) "
        procs[int(name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / hz)

    def tree(root: int) -> set[int]:
        out, grew = {root}, True
        while grew:
            grew = False
            for pid, (ppid, _) in procs.items():
                if ppid in out and pid not in out:
                    out.add(pid)
                    grew = True
        return out

    me, broker = os.getpid(), tree(broker_pid)
    used = lambda pids: sum(procs[p][1] for p in pids if p in procs)  # noqa: E731
    return {"this process": used({me}), "Spark (JVM, Python workers)": used(tree(me) - broker - {me}),
            "broker": used(broker)}


def cpu_used(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in before}


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


def phases(events: list[tuple[float, str]], started: float) -> dict[str, float]:
    """Seconds of each phase, from write_store's progress lines."""
    at = {}
    for t, m in events:
        for word in ("rows checked", "registered in", " wrote "):
            if word in m:
                at[word] = t
    checked = at["rows checked"]
    registered = at.get("registered in", checked)
    return {"checks": checked - started, "register": registered - checked, "produce": at[" wrote "] - registered}


SIDES = {"materialized": "input materialized", "computed": "input computed in the timing",
         "format": "input materialized, through df.write.format(\"federator\")"}
JUDGED = ("materialized", "format")  # the sides whose input is built before the timer, as the plain loop's


def size_rows(n: int, m: dict[str, float], first: float, side: str, plain_rate: float) -> list[str]:
    """One write_store variant's lines of a size's table (medians ``m`` of its rounds)."""
    rate = n / m["sink"]
    label = SIDES[side]
    if side == "format":  # one pass, in the Spark tasks: no phases to tell apart
        return [f"| {label}, end to end (Spark job, commit) | {m['sink']:.2f} | {rate:,.0f} | {rate / plain_rate:.2f}x |",
                f"| - first round only | {first:.2f} | {n / first:,.0f} | |"]
    produce_rate = n / m["produce"]
    return [
        f"| write_store end to end, {label} | {m['sink']:.2f} | {rate:,.0f} | {rate / plain_rate:.2f}x |",
        f"| - checks (pass 1: rows, checks and key hashes in Spark), incl. the catalog read | {m['checks']:.2f} | "
        f"{n / m['checks']:,.0f} | |",
        f"| - registration (new store: topic, catalog record) | {m['register']:.2f} | | |",
        f"| - serialize + produce (pass 2: rows read again, incl. flush) | {m['produce']:.2f} | "
        f"{produce_rate:,.0f} | {produce_rate / plain_rate:.2f}x |",
        f"| - first round only | {first:.2f} | {n / first:,.0f} | |",
    ]


@pytest.mark.timeout(1800)
def test_sink_vs_plain_producer(broker) -> None:
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from federator_spark.jobs.common import spark_session
    from federator_spark.sink import PRODUCER_CONFIG, write_store
    from federator_spark.source import last_write_token, register

    config = dict(PRODUCER_CONFIG)  # write_store's own producer settings, so both sides produce alike
    report = Report()
    bootstrap = broker.bootstrap_servers
    app_id = f"bk{uuid.uuid4().hex[:8]}"
    adm = kafka.admin(bootstrap)

    progress("starting SparkSession local[2]")
    t0 = time.perf_counter()
    spark = spark_session("local[2]", "federator-bench-sink")
    register(spark)
    progress(f"SparkSession up in {time.perf_counter() - t0:.1f}s")
    # size -> "plain": seconds per round; side -> phase -> seconds per round
    results: dict[int, dict[str, Any]] = {}
    cpu: dict[int, dict[str, list[dict[str, float]]]] = {}  # size -> side -> per round: CPU seconds by process
    try:
        def frame(n: int):
            return spark.range(n).select(F.format_string(KEY_FORMAT, F.col("id")).alias("key"),
                                         (F.col("id") * 7).alias("value"))

        events: list[tuple[float, str]] = []

        def say(msg: str) -> None:
            events.append((time.perf_counter(), msg))
            progress(f"  sink: {msg}")

        progress(f"warm-up: the format's and write_store's writes of {WARMUP_ROWS:,} rows (untimed)")
        t0 = time.perf_counter()
        # the format's own warm-up (its writer is made and committed in Python workers too)
        (frame(WARMUP_ROWS).write.format("federator").mode("append").option("store", "warmup_format")
         .option("key", "key").option("value", "value").option("partitions", PARTITIONS)
         .option("bootstrap_servers", bootstrap).option("application_id", app_id).save())
        write_store(frame(WARMUP_ROWS), "warmup", key="key", value="value", partitions=PARTITIONS,
                    bootstrap_servers=bootstrap, application_id=app_id, progress=say)
        progress(f"warm-up done in {time.perf_counter() - t0:.1f}s")

        def timed_write(n: int, rep: int, side: str) -> None:
            r = results[n][side]
            df = frame(n)
            if side in JUDGED:  # like the plain loop's lists: built before the timer starts
                df = df.persist(StorageLevel.MEMORY_ONLY)
                assert df.count() == n
            events.clear()
            store = f"bench_{side[:3]}_{n}_{rep}"
            before = cpu_seconds(broker.proc.pid)
            started = time.perf_counter()
            if side == "format":
                (df.write.format("federator").mode("append").option("store", store).option("key", "key")
                 .option("value", "value").option("partitions", PARTITIONS).option("bootstrap_servers", bootstrap)
                 .option("application_id", app_id).save())
            else:
                token = write_store(df, store, key="key", value="value", partitions=PARTITIONS,
                                    bootstrap_servers=bootstrap, application_id=app_id, progress=say)
            r["sink"].append(time.perf_counter() - started)
            cpu[n][side].append(cpu_used(before, cpu_seconds(broker.proc.pid)))
            if side in JUDGED:
                df.unpersist()
            if side == "format":
                token = last_write_token(app_id, store)
            written = sum(o + 1 for _t, _p, o in Position.from_token(token))
            assert written == n, f"the changelog holds {written} records after the write, not {n}"
            if side != "format":
                for phase, sec in phases(events, started).items():
                    r[phase].append(sec)
            progress(f"{n:,} rows, round {rep + 1}: {SIDES[side]}: {r['sink'][-1]:.2f}s "
                     f"({n / r['sink'][-1]:,.0f} records/s)")

        for n in SIZES:
            results[n] = {"plain": [], **{side: {k: [] for k in ("sink", "checks", "register", "produce")}
                                          for side in SIDES}}
            cpu[n] = {"plain": [], **{side: [] for side in SIDES}}
            for rep in range(REPS):
                topic = f"bench-plain-{uuid.uuid4().hex[:8]}"
                kafka.ensure_topic(adm, topic, PARTITIONS)
                before = cpu_seconds(broker.proc.pid)
                results[n]["plain"].append(plain_produce(bootstrap, topic, n, config))
                cpu[n]["plain"].append(cpu_used(before, cpu_seconds(broker.proc.pid)))
                progress(f"{n:,} rows, round {rep + 1}: plain producer {results[n]['plain'][-1]:.2f}s "
                         f"({n / results[n]['plain'][-1]:,.0f} records/s)")
                for side in SIDES:
                    timed_write(n, rep, side)
    finally:
        spark.stop()

    for n in SIZES:
        r = results[n]
        plain = statistics.median(r["plain"])
        plain_rate = n / plain
        med = {side: {k: statistics.median(v) for k, v in r[side].items() if v} for side in SIDES}
        rows = [
            "| measurement (median of rounds) | seconds | records/s | vs plain producer |",
            "|---|---:|---:|---:|",
            f"| plain confluent-kafka producer loop, incl. flush (1 Python thread) | {plain:.2f} | "
            f"{plain_rate:,.0f} | 1.00x |",
        ]
        for side in SIDES:
            rows += size_rows(n, med[side], r[side]["sink"][0], side, plain_rate)
        if all(cpu[n][side] and cpu[n][side][0] for side in cpu[n]):
            def cpu_line(side: str) -> str:
                return ", ".join(f"{k} {statistics.median(c[k] for c in cpu[n][side]):.2f}" for k in cpu[n][side][0])

            rows += ["", "CPU seconds (medians of rounds; 2 cores, so CPU seconds over 2 bound the time): "
                         f"plain loop: {cpu_line('plain')}; "
                         + "; ".join(f"{SIDES[side]}: {cpu_line(side)}" for side in SIDES) + "."]
        per_round = "; ".join(f"{SIDES[side]}: {', '.join(f'{x:.2f}' for x in r[side]['sink'])}"
                              for side in SIDES)
        report.section(f"{n:,} records (40-byte string keys, long values, {PARTITIONS} partitions)", [
            f"Rounds: {REPS}; each writes a fresh topic (plain) and fresh stores (write_store). Seconds per "
            f"round: plain: {', '.join(f'{x:.2f}' for x in r['plain'])}; {per_round}.", "", *rows])
        for side in SIDES:
            rate = n / med[side]["sink"]
            judged = side in JUDGED
            produce = f" (produce phase {n / med[side]['produce']:,.0f})" if "produce" in med[side] else ""
            produce_share = f" (produce phase {n / med[side]['produce'] / plain_rate:.0%})" \
                if "produce" in med[side] else ""
            report.target(f"write_store >= {T_SINK_RATE:,} records/s ({n:,} records, {SIDES[side]})",
                          f"{rate:,.0f} records/s end to end{produce}",
                          rate >= T_SINK_RATE if judged else None)
            report.target(f"write_store >= {T_SINK_FRACTION:.0%} of the plain producer's rate "
                          f"({n:,} records, {SIDES[side]})",
                          f"{rate:,.0f} vs {plain_rate:,.0f} = {rate / plain_rate:.0%} end to end{produce_share}",
                          rate / plain_rate >= T_SINK_FRACTION if judged else None)
    report.notes.append(
        f"Both sides use federator.kafka.producer (murmur2_random, idempotent) with write_store's settings "
        f"{config}. The plain loop's keys and values are built before timing; so is the materialized input "
        f"(cached and counted before the timer starts), and the targets are judged on it. The computed input "
        f"is reported beside it, not judged (n/a): its format_string keys are computed by both passes inside "
        f"the timing, so it also measures the DataFrame. write_store is timed around the call after an "
        f"untimed {WARMUP_ROWS:,}-row warm-up write in the same SparkSession. The format side "
        f"(df.write.format(\"federator\"), materialized input, append mode), after its own untimed "
        f"{WARMUP_ROWS:,}-row warm-up write, is timed around save(); "
        f"its records are counted from the token its commit recorded (federator_spark.source.last_write_token).")
    text = render(report)
    append_run(text)
    print("\n" + text + f"\n(appended to {RESULTS_MD})", flush=True)


def append_run(text: str, path: Path = RESULTS_MD) -> None:
    """Add this run's section after the runs kept before it (README quotes dated runs)."""
    title, _, run = text.partition("\n")
    if not path.exists():
        path.write_text(text)
        return
    with path.open("a") as f:
        f.write("\n---\n" + run.lstrip("\n"))
