"""Co-partitioned joins on the owners beside the same join at the receiver, and the receiver's
memory during a large Arrow answer; on a real broker and real node subprocesses.

1. ``SELECT *`` (Arrow) over a JOIN_ROWS-row store on one node: the node's peak RSS growth
   during the query (its VmHWM, reset before each query through /proc/<pid>/clear_refs, less
   its VmRSS before the query) against the size of the Arrow answer; first scan, kept scans,
   and on the node restarted with the scan cache off.
2. Two kv stores ``a`` (k string -> v long) and ``b`` (k string -> w long), JOIN_ROWS rows each,
   the same keys, the same partition count: ``a JOIN b ON a.k = b.k``, which each owner runs
   over its two partitions (as a key lookup in Arrow, federator.owner.keyjoin), beside
   ``ON a.k = b.k || ''`` (the same rows, a join the planner does not recognise as
   co-partitioned), which pulls both stores' rows (after the pushed-down filters) to the
   receiver and joins there in DuckDB. On one node, then on a 3-node cluster. Every run checks
   that the two answers are equal and right. On one node, each path's work is also timed alone
   in-process (the owners' lookup, the owners' statement with DuckDB's join as before the
   lookup, the receiver's statement), to show where time goes.

Nothing here asserts on timings: the figures and where each target stands are printed and
appended to tests/bench/results.md with the rest of the session's report. FEDERATOR_BENCH_JOIN_ROWS
(default 1,000,000) sizes the stores, FEDERATOR_BENCH_JOIN_REPEATS (default 5) the runs per
query and path, FEDERATOR_BENCH_JOIN_CLUSTER=0 skips the 3-node part, FEDERATOR_BENCH_JOIN_RSS_ONLY=1
runs part 1 alone (store a only, no joins: about a minute); for a quick look,
FEDERATOR_BENCH_RESULTS=/tmp/x.md keeps the run out of results.md. The default run takes
about 3 minutes on 2 cores (producing and materializing 2M records twice is most of it).
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
import uuid
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pytest

from federator import kafka
from federator.catalog.catalog import COMPACTED
from tests.bench.conftest import Report, progress
from tests.bench.loadgen import cpu_seconds
from tests.bench.test_bench_sql import post_sql, produce_kv
from tests.integration.changelog_util import register
from tests.integration.cluster import Cluster, NodeProcess, wait_for

ROWS = int(os.environ.get("FEDERATOR_BENCH_JOIN_ROWS", 1_000_000))  # rows in each of a and b
REPEATS = int(os.environ.get("FEDERATOR_BENCH_JOIN_REPEATS", 5))  # measured runs per query and path
RSS_REPEATS = 3
CLUSTER = os.environ.get("FEDERATOR_BENCH_JOIN_CLUSTER", "1") != "0"
RSS_ONLY = os.environ.get("FEDERATOR_BENCH_JOIN_RSS_ONLY", "0") == "1"  # part 1 alone, over store a
STORES = ("a",) if RSS_ONLY else ("a", "b")
PARTITIONS = 8
NO_REUSE = ("--reuse-answers-seconds", "0")

# ---- targets (reported, never asserted) ------------------------------------------------------
T_JOIN_SPEEDUP = 3.0  # the join on the owners >= 3x faster than at the receiver
T_RSS_FACTOR = 2.0  # peak RSS growth of the receiver <= 2x the Arrow answer's size


def v_of(i: int) -> int:
    return 3 * i


def w_of(i: int) -> int:
    return i


# (label, SQL on the owners, the same at the receiver, expected rows)
SUM_ALL = 4 * ROWS * (ROWS - 1) // 2  # sum of v + w = 3i + i over every key
SELECTIVE = min(100, ROWS)
QUERIES = [
    ("COUNT(*), SUM(a.v + b.w), every row joins",
     "SELECT COUNT(*), SUM(a.v + b.w) FROM a JOIN b ON a.k = b.k",
     "SELECT COUNT(*), SUM(a.v + b.w) FROM a JOIN b ON a.k = b.k || ''",
     [[ROWS, SUM_ALL]]),
    (f"the same WHERE b.w < {SELECTIVE} ({SELECTIVE} rows join)",
     f"SELECT COUNT(*), SUM(a.v + b.w) FROM a JOIN b ON a.k = b.k WHERE b.w < {SELECTIVE}",
     f"SELECT COUNT(*), SUM(a.v + b.w) FROM a JOIN b ON a.k = b.k || '' WHERE b.w < {SELECTIVE}",
     [[SELECTIVE, 4 * SELECTIVE * (SELECTIVE - 1) // 2]]),
]


# ---- data: two topics produced once for the module; each cluster is a new application ----------
@pytest.fixture(scope="module")
def topics(broker) -> dict[str, str]:
    tag = uuid.uuid4().hex[:8]
    out = {store: f"bj{tag}-{store}-changelog" for store in STORES}
    adm = kafka.admin(broker.bootstrap_servers)
    for store, value_of in (("a", v_of), ("b", w_of))[:len(STORES)]:
        kafka.ensure_topic(adm, out[store], PARTITIONS, COMPACTED)  # as registering a store creates it
        progress(f"join: producing {ROWS:,} rows into {out[store]}")
        took = produce_kv(broker.bootstrap_servers, out[store], ROWS, value_of)
        progress(f"produced {ROWS:,} rows in {took:.1f}s ({ROWS / took:,.0f}/s)")
    return out


def start_cluster(broker, topics: dict[str, str], root: Path, size: int, report: Report) -> Cluster:
    """A new application over the module's topics (stores a and b, or a alone), materialized and settled."""
    app_id = f"bj{uuid.uuid4().hex[:8]}"
    for store, value in (("a", "v"), ("b", "w"))[:len(STORES)]:
        register(broker, app_id, {"name": store, "type": "kv", "partitions": PARTITIONS, "topic": topics[store],
                                  "key": {"name": "k", "format": "string"}, "value": {"name": value, "format": "long"}})
    cluster = Cluster(broker.bootstrap_servers, app_id, root, size=size, standby_replicas=0)
    for node in cluster.nodes:  # both paths compute every run: no answer reused from the last
        node.extra_args = list(NO_REUSE)
    t0 = time.perf_counter()

    def materialized() -> bool:
        n = sum(sum(node.metadata()["local"]["records_applied"].values()) for node in cluster.nodes)
        progress(f"  {size} node(s): materialized {n:,} / {len(STORES) * ROWS:,}")
        return n >= len(STORES) * ROWS and all(node.ready() for node in cluster.nodes)

    try:
        cluster.start()
        wait_for(materialized, 600, f"the nodes to materialize {' and '.join(STORES)}", interval=3)
        for store in STORES:
            cluster.wait_settled(store, PARTITIONS, timeout=120)
    except BaseException:
        cluster.stop()
        raise
    took = time.perf_counter() - t0
    report.notes.append(f"Materializing {' and '.join(STORES)} ({ROWS:,} rows each) on {size} node(s), start to settled: "
                        f"{took:.1f}s.")
    progress(f"{size} node(s) materialized and settled in {took:.1f}s")
    return cluster


@pytest.fixture(scope="class")
def one_node(broker, topics, report: Report, tmp_path_factory) -> Iterator[NodeProcess]:
    """One node for the tests of TestOneNode, stopped before the 3-node cluster starts."""
    cluster = start_cluster(broker, topics, tmp_path_factory.mktemp("bench-join-1"), 1, report)
    try:
        yield cluster.nodes[0]
    finally:
        cluster.stop()


def sql_json(node: NodeProcess, sql: str) -> dict:
    return json.loads(post_sql(node, sql, timeout=300).data)


def status_kb(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


# ---- co-partitioned joins on the owners beside the receiver ------------------------------------
def measure_joins(nodes: list[NodeProcess], receiver: NodeProcess, where: str, report: Report) -> dict[str, float]:
    """Each query on both paths, REPEATS times (alternating), answers checked; a table in the report."""
    pids = [n.proc.pid for n in nodes]  # type: ignore[union-attr]
    # the plan each path gets, as EXPLAIN says and as the answer's stats say
    for _, owners_sql, receiver_sql, _ in QUERIES:
        owners_plan = json.dumps(sql_json(receiver, "EXPLAIN " + owners_sql)["rows"])
        receiver_plan = json.dumps(sql_json(receiver, "EXPLAIN " + receiver_sql)["rows"])
        assert "co-partitioned" in owners_plan, owners_plan
        assert "co-partitioned" not in receiver_plan, receiver_plan
    rows: list[str] = []
    ratios: dict[str, float] = {}
    load_before = os.getloadavg()[0]
    for label, owners_sql, receiver_sql, expected in QUERIES:
        runs: dict[str, list[tuple[float, float, float]]] = {"owners": [], "receiver": []}
        for i in range(REPEATS + 1):  # the first pair is a warm-up (plans, kept scans)
            answers = {}
            for path, sql in (("owners", owners_sql), ("receiver", receiver_sql)):
                c0, t = sum(cpu_seconds(p) for p in pids), time.perf_counter()
                body = sql_json(receiver, sql)
                took = time.perf_counter() - t
                cpu = sum(cpu_seconds(p) for p in pids) - c0
                assert body["stats"].get("joined_on_owners", False) == (path == "owners"), (path, body["stats"])
                answers[path] = body["rows"]
                if i:
                    runs[path].append((took, cpu, body["stats"]["elapsed_ms"] / 1000))
            assert answers["owners"] == answers["receiver"] == expected, (label, answers, expected)
        med = {p: statistics.median(s for s, _, _ in r) for p, r in runs.items()}
        cpu = {p: statistics.median(c for _, c, _ in r) for p, r in runs.items()}
        server = {p: statistics.median(e for _, _, e in r) for p, r in runs.items()}
        ratio = med["receiver"] / med["owners"]
        ratios[label] = ratio
        spread = {p: f"{min(s for s, _, _ in r):.3f}-{max(s for s, _, _ in r):.3f}" for p, r in runs.items()}
        rows.append(f"| {label} | {med['owners']:.3f} ({spread['owners']}) | {med['receiver']:.3f} "
                    f"({spread['receiver']}) | {server['owners']:.3f} / {server['receiver']:.3f} | "
                    f"{cpu['owners']:.2f} / {cpu['receiver']:.2f} | {ratio:.1f}x |")
        progress(f"  [{where}] {label}: owners {med['owners']:.3f}s, receiver {med['receiver']:.3f}s = {ratio:.1f}x "
                 f"(node CPU {cpu['owners']:.2f} / {cpu['receiver']:.2f} s)")
    report.notes.append(f"Load average (1 min) around the join runs ({where}): {load_before:.2f} before, "
                        f"{os.getloadavg()[0]:.2f} after; anything above what this run's own processes add is other "
                        "work on the machine.")
    report.section(f"Co-partitioned join on the owners vs at the receiver ({where}; a and b {ROWS:,} rows each)", [
        f"a: k string -> v = 3i, b: k string -> w = i, the same {ROWS:,} keys, {PARTITIONS} partitions each. "
        "On the owners: `a JOIN b ON a.k = b.k` (each owner joins its two partitions as a key lookup in Arrow, "
        "b's own filter `b.w < ...` applied first and kept beside b's scan as on the receiver's path, then runs the "
        "filter and the partial aggregate over the joined rows in DuckDB, and returns one row). At the receiver: "
        "`ON a.k = b.k || ''`, "
        "the same rows, not recognised as co-partitioned: both stores' rows (after the filters pushed to their "
        "owners: `b.w < ...` goes to b's owners, every row of a comes) are pulled and joined by the receiving "
        f"node. {REPEATS} runs per query and path after one warm-up pair, alternating; medians (min-max). "
        "Shards unchanged between runs, so both paths read each shard's kept scan, and b's filtered rows on "
        "either path come from a result kept beside b's scan; the joined rows are computed every time (nothing "
        "keeps a result over two shards). Every run checked: both "
        "answers equal and right, stats.joined_on_owners true only on the owners' path, EXPLAIN agreeing.",
        "",
        "| query | on the owners s | at the receiver s | server elapsed s (owners / receiver) "
        "| node CPU s (owners / receiver) | owners faster by |",
        "|---|---:|---:|---:|---:|---:|",
        *rows])
    return ratios


# ---- on one node: the receiver's memory during SELECT * in Arrow, then the joins --------------
def reset_peak(pid: int) -> bool:
    """Reset the process's VmHWM (its peak RSS) to its current RSS; False when not permitted."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def measure_select_star(node: NodeProcess, label: str, check_values: bool) -> tuple[float, str]:
    """One ``SELECT * FROM a`` in Arrow: (peak RSS growth / answer bytes, a table row)."""
    pid = node.proc.pid  # type: ignore[union-attr]
    time.sleep(1.0)  # let the heartbeat and the tail settle
    can_reset = reset_peak(pid)
    before = status_kb(pid, "VmRSS")
    sampled = [before]
    stop = threading.Event()

    def sample() -> None:  # a cross-check of VmHWM, and the measure when it cannot be reset
        while not stop.is_set():
            sampled.append(status_kb(pid, "VmRSS"))
            time.sleep(0.002)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t = time.perf_counter()
    data = post_sql(node, "SELECT * FROM a", fmt="arrow", timeout=300).data
    took = time.perf_counter() - t
    stop.set()
    sampler.join()
    peak = status_kb(pid, "VmHWM") if can_reset else max(sampled)
    after = status_kb(pid, "VmRSS")
    table = pa.ipc.open_stream(data).read_all()
    assert table.num_rows == ROWS, table.num_rows
    assert table.column_names == ["k", "v"], table.column_names
    if check_values:
        got = list(zip(table.column("k").to_pylist()[:1000], table.column("v").to_pylist()[:1000]))
        assert all(v == v_of(int(k[4:])) for k, v in got), got[:5]
    growth = (peak - before) * 1024
    cache = node.metadata()["local"]["scan_cache"]
    progress(f"  SELECT * FROM a (arrow), {label}: {took:.2f}s, answer {len(data) / 1e6:.1f} MB, RSS {before / 1024:.0f} "
             f"-> peak {peak / 1024:.0f} MB (+{growth / 1e6:.1f} MB = {growth / len(data):.2f}x the answer), "
             f"after {after / 1024:.0f} MB, scan cache {cache['bytes'] / 1e6:.1f} MB")
    row = (f"| {label} | {took:.2f} | {len(data) / 1e6:.1f} | {table.nbytes / 1e6:.1f} | {before / 1024:.0f} | "
           f"{peak / 1024:.0f} | {growth / 1e6:.1f} | {growth / len(data):.2f}x | {max(sampled) / 1024:.0f} | "
           f"{after / 1024:.0f} | {cache['bytes'] / 1e6:.1f} |")
    return growth / len(data), row


def restart(node: NodeProcess, extra_args: list[str]) -> None:
    node.stop()
    node.extra_args = [*NO_REUSE, *extra_args]
    node.start()
    wait_for(node.ready, 120, "the restarted node to be ready", interval=0.5)


def duckdb_split(report: Report) -> None:
    """Each path's work alone, in this process over Arrow rows like the shards': the owners'
    as Node._join runs it (keyjoin.run: b's filter first, kept beside its scan as on a node,
    the key lookup per partition on DuckDB's two threads, then the owner's SQL once over all
    the joined rows), the same with DuckDB's join (how owners joined before the lookup), and
    the receiver's one statement over all the rows."""
    from concurrent.futures import ThreadPoolExecutor

    from federator.catalog.definition import StoreDefinition
    from federator.partitioner import partition_for
    from federator.owner import keyjoin
    from federator.owner.duck import Duck, one_batch
    from federator.sql.parse import parse
    from federator.sql.planner import bind_parameters, plan_query
    from federator.store.scan_cache import ScanCache
    from tests.registry import REGISTRY

    cache = ScanCache(256 << 20)  # the node's scan cache, as Node._join passes it

    progress("in-process split: building the partitions' Arrow rows")
    stores = {name: StoreDefinition.from_dict({
        "name": name, "type": "kv", "partitions": PARTITIONS, "topic": f"bench-{name}",
        "key": {"name": "k", "format": "string"}, "value": {"name": value, "format": "long"}}, REGISTRY)
        for name, value in (("a", "v"), ("b", "w"))}
    part: list[list[int]] = [[] for _ in range(PARTITIONS)]
    for i in range(ROWS):
        part[partition_for(f"key-{i:07d}".encode(), PARTITIONS)].append(i)  # in key order, as a scan gives them
    left, right = [], []
    for idx in part:
        keys = pa.array([f"key-{i:07d}" for i in idx], pa.string())
        stamps = pa.array([0] * len(idx), pa.timestamp("ms", tz="UTC"))
        left.append(pa.record_batch([keys, pa.array([v_of(i) for i in idx], pa.int64()), stamps],
                                    schema=stores["a"].arrow_schema()))
        right.append(pa.record_batch([keys, pa.array([w_of(i) for i in idx], pa.int64()), stamps],
                                     schema=stores["b"].arrow_schema()))
    duck = Duck()
    cur = duck.local_cursor()
    pool = ThreadPoolExecutor(duck.config.threads)  # as Node._join_workers
    shards = [(object(), object()) for _ in range(PARTITIONS)]  # stand-ins for the shards whose scans are kept
    for (a_shard, b_shard), lb, rb in zip(shards, left, right):
        cache.put(a_shard, 1, lb)
        cache.put(b_shard, 1, rb)

    def schema_of(sql: str, relations: dict[str, pa.Table]) -> pa.Schema:
        schema, batches = duck.stream(sql, relations, None)
        for _ in batches:
            pass
        return schema

    def timed(fn) -> float:
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t

    def receiver(sql: str, b: pa.Table) -> None:
        for _ in duck.stream(sql, {"a": pa.Table.from_batches(left), "b": b}, None)[1]:
            pass

    lines = ["| query | owners: key lookup + 1 statement over the 8 partitions, s | owners with DuckDB's join "
             "(before), s | receiver: 1 statement, s | owners' path over 10+10 rows, ms |", "|---|---:|---:|---:|---:|"]
    for label, owners_sql, receiver_sql, _ in QUERIES:
        plan = plan_query(bind_parameters(parse(owners_sql).select, [], 0), stores.get, lambda n: None, [], schema_of)
        (ref,) = plan.refs
        assert ref.key_join is not None, owners_sql
        parts = [(lb, rb, a_shard, b_shard) for (a_shard, b_shard), lb, rb in zip(shards, left, right)]
        tiny = [(left[0].slice(0, 10), right[0].slice(0, 10), None, None)]
        b = pa.Table.from_batches(right)
        if "WHERE" in receiver_sql:  # at the node, b's owners filter (and keep the result beside the scan)
            where = receiver_sql.split("WHERE", 1)[1].replace("b.", "")
            b = duck.over_rows(f"SELECT * FROM rows WHERE {where}", b)

        def lookup() -> None:
            keyjoin.run(ref.key_join, duck, parts, pool, True, cache)

        def duckdb_join() -> None:  # as Node._join ran it before the lookup
            cur.register(keyjoin.LEFT, pa.Table.from_batches(left))
            cur.register(keyjoin.RIGHT, pa.Table.from_batches(right))
            one_batch(cur.sql(ref.work.sql).to_arrow_table())
            cur.unregister(keyjoin.LEFT)
            cur.unregister(keyjoin.RIGHT)

        runs = [(timed(lookup), timed(duckdb_join), timed(lambda: receiver(receiver_sql, b))) for _ in range(REPEATS + 1)][1:]
        med = [statistics.median(r[i] for r in runs) for i in range(3)]
        fixed = statistics.median(timed(lambda: keyjoin.run(ref.key_join, duck, tiny, pool, True, cache)) for _ in range(20))
        lines.append(f"| {label} | {med[0]:.3f} | {med[1]:.3f} | {med[2]:.3f} | {fixed * 1e3:.1f} |")
        progress(f"  in-process: {label}: owners {med[0]:.3f}s (with DuckDB's join {med[1]:.3f}s), receiver "
                 f"{med[2]:.3f}s, owners' path over 10+10 rows {fixed * 1e3:.1f} ms")
    pool.shutdown()
    for a_shard, b_shard in shards:
        cache.drop(a_shard)
        cache.drop(b_shard)
    report.section("Where the join time goes: each path's work alone (in-process, one node's share)", [
        f"The same {ROWS:,}+{ROWS:,} rows as Arrow batches per partition in key order, no RocksDB, no HTTP, no "
        "planning. Owners: the statement planned as a node plans it, run as Node._join runs it (keyjoin.run): b's "
        "own filter first, kept beside b's scan after the warm-up as on a node, then per partition the key lookup "
        "on DuckDB's two threads (the same keys in the same order pair row by row; a side cut down by its filter is "
        "hashed and probed), then the owner's partial aggregate once over all the joined rows. Beside it the same "
        "statement with DuckDB's hash join over all the partitions, as owners ran it before. Receiver: the `|| ''` "
        "statement over all rows of a and b (for the selective query b already filtered, as b's owners return it). "
        f"Medians of {REPEATS} runs after one warm-up; the last column is the owners' path over 10+10 rows.",
        "", *lines])


class TestOneNode:
    @pytest.mark.timeout(900)
    def test_select_star_arrow_rss(self, one_node: NodeProcess, report: Report) -> None:
        """Runs first, on the node fresh from materializing (no full scan yet)."""
        node = one_node
        if not reset_peak(node.proc.pid):  # type: ignore[union-attr]
            report.notes.append("Could not reset the node's VmHWM through /proc/<pid>/clear_refs; peak RSS is the max "
                                "of VmRSS sampled every 2 ms.")

        def first_use() -> None:
            """The Arrow answer path's first use (imports, buffers) outside the measured runs: a key range."""
            warm = pa.ipc.open_stream(post_sql(node, "SELECT * FROM a WHERE k < 'key-0000100'", fmt="arrow").data)
            assert warm.read_all().num_rows == min(100, ROWS)

        first_use()
        rows: list[str] = []
        ratios: dict[str, list[float]] = {}
        for i in range(RSS_REPEATS):
            kind = "cold" if i == 0 else "warm"
            r, row = measure_select_star(node, f"{i + 1}: {kind}", check_values=i == 0)
            ratios.setdefault(kind, []).append(r)
            rows.append(row)
        progress("restarting the node with --scan-cache-mb 0 (no kept scans)")
        restart(node, ["--scan-cache-mb", "0"])
        try:
            first_use()
            for i in range(2):
                r, row = measure_select_star(node, f"{i + 1}: scan cache off", check_values=False)
                ratios.setdefault("off", []).append(r)
                rows.append(row)
        finally:
            progress("restarting the node with its defaults")
            restart(node, [])
        report.section(f"Receiver memory: SELECT * over {ROWS:,} rows in Arrow (one node, kv string -> long, "
                       f"{PARTITIONS} partitions)", [
            "The node is its own receiver and owner of every partition, fresh from materializing (one Arrow answer "
            "over a 100-key range before, so first-use costs stay out). Before each query its peak RSS (VmHWM) is "
            "reset through /proc/<pid>/clear_refs; growth = VmHWM after the query less VmRSS before it. Cold: the "
            "first full scan, every shard read from RocksDB and its scan kept (the scan cache, which stays in memory "
            "afterwards: last column). Warm: answered from the kept scans. Scan cache off: the node restarted with "
            "--scan-cache-mb 0, every run reads RocksDB and keeps nothing, so its growth is the query's alone. "
            "A later run reuses memory the allocator kept from an earlier one (its RSS before is higher), so the "
            "first run of each kind is the query's real peak. "
            "Answer = the Arrow IPC stream's bytes as received; Arrow table = its decoded size.",
            "",
            "| run | seconds | answer MB (IPC) | Arrow table MB | RSS before MB | peak MB | growth MB | growth / answer "
            "| sampled max MB | RSS after MB | scan cache MB |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            *rows])
        worst = max(max(v) for v in ratios.values())
        report.target(f"SELECT * over {ROWS:,} rows (Arrow): receiver's peak RSS growth <= {T_RSS_FACTOR:.0f}x the answer",
                      f"cold (shards read, scans kept): {max(ratios['cold']):.2f}x; warm (from kept scans): "
                      f"{max(ratios['warm']):.2f}x; scan cache off: {max(ratios['off']):.2f}x", worst <= T_RSS_FACTOR)

    @pytest.mark.timeout(900)
    @pytest.mark.skipif(RSS_ONLY, reason="FEDERATOR_BENCH_JOIN_RSS_ONLY=1")
    def test_copartitioned_join_one_node(self, one_node: NodeProcess, report: Report) -> None:
        ratios = measure_joins([one_node], one_node, "one node", report)
        for _, owners_sql, _, _ in QUERIES:
            pushed = sql_json(one_node, "EXPLAIN " + owners_sql)["rows"][0][4]
            assert pushed.startswith("join as a key lookup in Arrow"), pushed
        duckdb_split(report)
        for label, r in ratios.items():
            report.target(f"co-partitioned join on the owners >= {T_JOIN_SPEEDUP:.0f}x faster than at the receiver "
                          f"(one node; {label})", f"{r:.1f}x", r >= T_JOIN_SPEEDUP)


@pytest.mark.timeout(1200)
@pytest.mark.skipif(not CLUSTER or RSS_ONLY, reason="FEDERATOR_BENCH_JOIN_CLUSTER=0 or FEDERATOR_BENCH_JOIN_RSS_ONLY=1")
def test_copartitioned_join_three_nodes(broker, topics, report: Report, tmp_path_factory) -> None:
    cluster = start_cluster(broker, topics, tmp_path_factory.mktemp("bench-join-3"), 3, report)
    try:
        owners = [cluster.active_map(s) for s in ("a", "b")]
        assert owners[0] == owners[1], owners  # the assignor put each pair of partitions p on one node
        ratios = measure_joins(cluster.nodes, cluster.nodes[0], "3-node cluster, sent to n0", report)
    finally:
        cluster.stop()
    for label, r in ratios.items():
        report.target(f"co-partitioned join on the owners >= {T_JOIN_SPEEDUP:.0f}x faster than at the receiver "
                      f"(3 nodes; {label})", f"{r:.1f}x", r >= T_JOIN_SPEEDUP)
