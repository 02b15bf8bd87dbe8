"""Point lookups beside Faust: one Federator node and one Faust ``table_route`` worker, same run.

Both serve the same store: POINT_ROWS keys ``key-NNNNNNN`` -> long, in one 8-partition topic
on the session's tansu broker. The Federator node materializes it as its ``kv`` store; the
Faust worker (tests/bench/faust_app.py, run from its own virtualenv ``.venv-faust``) restores
it into a Table whose changelog topic it is, and answers ``GET /kv/<key>/`` through
``@app.table_route``. Once both hold every key and answer a sample of them right, wrk
(tests/bench/wrk_point.lua: random keys, pre-built requests) measures, at 1, 10 and 50
connections, in ROUNDS interleaved rounds:

- Faust: ``GET /kv/<key>/``
- Federator SQL point: ``POST /v1/sql`` with ``SELECT * FROM kv WHERE key = ?``
- Federator REST: ``GET /v1/stores/kv/keys/<key>``

and every Federator figure is reported as a ratio to Faust's at the same concurrency. Then, with
Faust stopped, a second node joins and the SQL point query is measured at 1 and 10 connections
for keys the first node holds and for keys it must read from the second (routed), as a ratio,
beside two baselines of the least a routed read adds: the same hop with no query engine
(tests/bench/bare_hop.py) and a bare round trip between two processes (tests/bench/round_trip.py).
Nothing is asserted on timings. About two minutes of load, three minutes in all.
FEDERATOR_BENCH_SECONDS (per load, default 4), FEDERATOR_BENCH_FAUST_ROUNDS (default 2) and
FEDERATOR_BENCH_FAUST_ROWS (default POINT_ROWS) shrink it for a quick look;
FEDERATOR_BENCH_FAUST_PYTHON names another Python with faust-streaming (default .venv-faust's);
FEDERATOR_BENCH_SERVER names the node's HTTP server (`--server`: granian, loop, waitress; default
the node's default), so one machine can measure each.
The test is skipped when wrk or the Faust venv is missing (`make bench` provides both).
"""

from __future__ import annotations

import json
import os
import statistics
import struct
import subprocess
import time
import uuid
from pathlib import Path
from typing import Callable

import pytest
import urllib3

from federator import kafka
from federator.broker import die_with_parent
from federator.partitioner import partition_for
from federator.settings import NodeSettings
from tests.bench.bare_hop import bare_hops
from tests.bench.conftest import SERVER, Report, progress
from tests.bench.round_trip import RoundTrip, bare_round_trips
from tests.bench.test_bench_sql import PARTITIONS, POINT_ROWS, POINT_SQL, REPO, SECONDS, key_of, post_sql, produce_kv
from tests.bench.wrk import WrkResult, loop_requests, run_wrk, wrk_binary, wrk_version
from tests.conftest import free_port, stop_process
from tests.integration.changelog_util import register
from tests.integration.cluster import Cluster, wait_for

ROWS = int(os.environ.get("FEDERATOR_BENCH_FAUST_ROWS", POINT_ROWS))
ROUNDS = int(os.environ.get("FEDERATOR_BENCH_FAUST_ROUNDS", 2))
WARMUP_S = 1.0
CLIENTS = (1, 10, 50)
FAUST_PYTHON = Path(os.environ.get("FEDERATOR_BENCH_FAUST_PYTHON") or REPO / ".venv-faust" / "bin" / "python")
FAUST_APP = Path(__file__).with_name("faust_app.py")
SYSTEMS = (  # (label, wrk_point.lua mode)
    ("Faust table_route GET", "faust"),
    ("Federator SQL point", "sql"),
    ("Federator REST GET", "rest"),
)

# ---- targets of issue 45 that this run measures (reported, never asserted) ----------------------
T_SQL_VS_FAUST_RPS = 1.2  # SQL point req/s at c=10 at least this many times Faust's ...
T_SQL_VS_FAUST_P99 = 1.2  # ... with a p99 at most this many times Faust's
HTTP = urllib3.PoolManager(maxsize=4, retries=False)


def value_of(i: int) -> int:
    return i * 7


def produce_whole(bootstrap: str, topic: str, n: int) -> None:
    """key_of(i) -> value_of(i) for i < n, the last record of each partition in a batch of its own.

    tansu reports a partition's high watermark as its last batch's base offset + 1, and Faust's
    table recovery reads up to the high watermark, so it would leave out the rest of every
    partition's last batch (and an active Faust table reads its changelog only while it recovers).
    A last batch of one record has its true high watermark. Federator is not affected either way.
    """
    last: dict[int, int] = {}
    for i in range(n):
        last[partition_for(key_of(i).encode(), PARTITIONS)] = i
    produce_kv(bootstrap, topic, n, value_of, skip=frozenset(last.values()))
    p = kafka.producer(bootstrap, **{"linger.ms": 0})
    for i in sorted(last.values()):
        p.produce(topic, key=key_of(i).encode(), value=struct.pack(">q", value_of(i)))
        assert p.flush(30) == 0


class FaustWorker:
    """tests/bench/faust_app.py as a `faust worker` subprocess of the Faust venv's Python."""

    def __init__(self, bootstrap: str, topic: str, root: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = root / "faust.log"
        self.dir = root / "faust-data"
        self.app_id = f"fz{uuid.uuid4().hex[:8]}"
        self.env = {**os.environ, "FAUST_BENCH_BROKER": bootstrap, "FAUST_BENCH_TOPIC": topic,
                    "FAUST_BENCH_PARTITIONS": str(PARTITIONS), "FAUST_BENCH_APP": self.app_id,
                    "FAUST_BENCH_PORT": str(self.port), "FAUST_BENCH_DIR": str(self.dir)}
        self.env.pop("PYTHONPATH", None)  # its own venv: nothing of ours on its path
        self.proc: subprocess.Popen | None = None

    def version(self) -> str:
        out = subprocess.run([str(FAUST_PYTHON), "-c", "import faust, aiokafka, aiohttp; "
                              "print(faust.__version__, aiokafka.__version__, aiohttp.__version__)"],
                             capture_output=True, text=True, timeout=60, env=self.env)
        faust_v, aiokafka_v, aiohttp_v = out.stdout.split()
        return f"faust-streaming {faust_v} (aiokafka {aiokafka_v}, aiohttp {aiohttp_v})"

    def start(self) -> FaustWorker:
        self.proc = subprocess.Popen([str(FAUST_PYTHON), str(FAUST_APP), "worker", "--loglevel", "info"],
                                     cwd=self.dir.parent, env=self.env, stdout=open(self.log, "w"),
                                     stderr=subprocess.STDOUT, preexec_fn=die_with_parent())
        return self

    def keys(self) -> int:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"the Faust worker exited ({self.proc.returncode}):\n{self.log_tail()}")
        try:
            resp = HTTP.request("GET", f"{self.url}/bench/size/", timeout=2)
        except urllib3.exceptions.HTTPError:  # not listening yet
            return -1
        return json.loads(resp.data)["keys"] if resp.status == 200 else -1

    def get(self, key: str) -> dict:
        resp = HTTP.request("GET", f"{self.url}/kv/{key}/", timeout=5)
        assert resp.status == 200, resp.data[:300]
        return json.loads(resp.data)

    def log_tail(self, n: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:]) if self.log.exists() else ""

    def stop(self) -> None:
        """SIGTERM, and Faust's own shutdown (it leaves the group); SIGKILL after 30 s."""
        if self.proc is not None:
            stop_process(self.proc, 30)


def _routed_rows(c: int, server: str, fig: Callable[[str, str], float], errors: dict[str, int]) -> list[str]:
    """A local and a routed row (``fig(kind, attr)``: a WrkResult figure), the routed one with its
    ratios to the local one and what it adds to it."""
    out = []
    for kind in ("local", "routed"):
        vs = ["baseline", "", "", ""] if kind == "local" else [
            ratio(fig(kind, "rate"), fig("local", "rate")), ratio(fig(kind, "p50_ms"), fig("local", "p50_ms")),
            f"{fig(kind, 'p50_ms') - fig('local', 'p50_ms'):.2f}",
            f"{fig(kind, 'server_us_per_req') - fig('local', 'server_us_per_req'):,.0f}"]
        out.append(f"| {c} | {server} | {kind}{f' ({errors[kind]:,} errors)' if errors[kind] else ''} | "
                   f"{fig(kind, 'rate'):,.0f} | {fig(kind, 'p50_ms'):.2f} | {fig(kind, 'p99_ms'):.2f} | "
                   f"{fig(kind, 'server_us_per_req'):,.0f} | {' | '.join(vs)} |")
    return out


def ratio(x: float, base: float) -> str:
    return f"{x / base:.2f}x" if base else "-"


@pytest.mark.timeout(600)
def test_point_lookups_vs_faust(broker, report: Report, tmp_path_factory) -> None:
    if wrk_binary() is None:
        pytest.skip("wrk is not installed (`make bench` installs Debian's package: apt-get install wrk)")
    if not FAUST_PYTHON.exists():
        pytest.skip(f"no Faust virtualenv at {FAUST_PYTHON} (`make bench` makes it from setup.cfg's bench extra)")
    app_id = f"bf{uuid.uuid4().hex[:8]}"
    defn = register(broker, app_id, {"name": "kv", "type": "kv", "partitions": PARTITIONS,
                                     "key": {"format": "string"}, "value": {"format": "long"}})
    progress(f"Faust beside Federator: producing {ROWS:,} rows into {defn.topic}")
    produce_whole(broker.bootstrap_servers, defn.topic, ROWS)

    root = tmp_path_factory.mktemp("bench-faust")
    keys_file = root / "keys.txt"
    keys_file.write_text("".join(key_of(i) + "\n" for i in range(ROWS)))
    faust = FaustWorker(broker.bootstrap_servers, defn.topic, root)
    # n1 joins only after the rounds beside Faust (see measure_routed)
    cluster = Cluster(broker.bootstrap_servers, app_id, root, size=2, standby_replicas=0,
                      servers={0: SERVER, 1: SERVER} if SERVER else None)
    node = cluster.nodes[0]
    results: dict[tuple[str, int], list[WrkResult]] = {}
    routed: dict[tuple[str, int], list[WrkResult]] = {}
    try:
        progress("starting the Faust worker and one `federator node`")
        t0 = time.perf_counter()
        faust.start()
        node.start()

        def node_caught_up() -> bool:
            return sum(node.metadata()["local"]["records_applied"].values()) >= ROWS and node.ready()

        wait_for(node_caught_up, 240, "the node to materialize the store", interval=0.5)
        cluster.wait_settled("kv", PARTITIONS, timeout=60)
        progress(f"  Federator node ready with {ROWS:,} rows after {time.perf_counter() - t0:.1f}s")

        def faust_caught_up() -> bool:
            n = faust.keys()
            progress(f"  Faust table: {n:,} / {ROWS:,} keys")
            return n >= ROWS

        try:
            wait_for(faust_caught_up, 300, "the Faust worker's table to hold every key", interval=2)
        except AssertionError as e:
            raise AssertionError(f"{e}\nFaust log:\n{faust.log_tail()}") from None
        progress(f"  Faust worker ready with {ROWS:,} keys after {time.perf_counter() - t0:.1f}s")

        # Correctness first: both answer a sample of keys with the right value.
        for i in range(0, ROWS, max(1, ROWS // 20)):
            k, want = key_of(i), value_of(i)
            assert faust.get(k) == {"key": k, "value": want}, (k, faust.get(k))
            rows = json.loads(post_sql(node, POINT_SQL, [k]).data)["rows"]
            assert rows == [[k, want]], (k, rows)
            row = json.loads(HTTP.request("GET", f"http://{node.endpoint}/v1/stores/kv/keys/{k}").data)
            assert row["key"] == k and row["value"] == want, row

        pids = {"faust": [faust.proc.pid], "sql": [node.proc.pid], "rest": [node.proc.pid]}  # type: ignore[union-attr]
        urls = {"faust": faust.url, "sql": f"http://{node.endpoint}", "rest": f"http://{node.endpoint}"}
        total = ROUNDS * len(CLIENTS) * len(SYSTEMS)
        step = 0
        for rnd in range(ROUNDS):
            for c in CLIENTS:
                order = SYSTEMS if rnd % 2 == 0 else SYSTEMS[::-1]  # neither side always goes first
                for label, mode in order:
                    step += 1
                    run_wrk("warm-up", urls[mode], mode, keys_file, c, WARMUP_S)
                    r = run_wrk(label, urls[mode], mode, keys_file, c, SECONDS, pids[mode])
                    results.setdefault((mode, c), []).append(r)
                    progress(f"[{step}/{total}] round {rnd + 1}: {r.line()}")
        faust_version, wrk_v = faust.version(), wrk_version()
        faust.stop()
        routed, from_owner = measure_routed(cluster, root)
        bare = bare_round_trips()
        hops = bare_hops(keys_file, ROUTED_CLIENTS, SECONDS, WARMUP_S)
    finally:
        faust.stop()
        cluster.stop()
    assert faust.proc is not None and faust.proc.poll() is not None, "the Faust worker is still running"

    def med(mode: str, c: int, attr: str) -> float:
        return statistics.median(getattr(r, attr) for r in results[(mode, c)])

    rows = ["| concurrency | server | req/s | p50 ms | p99 ms | server CPU us/req | req/s vs Faust | p50 vs Faust "
            "| p99 vs Faust |", "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for c in CLIENTS:
        f_rate, f_p50, f_p99 = med("faust", c, "rate"), med("faust", c, "p50_ms"), med("faust", c, "p99_ms")
        for label, mode in SYSTEMS:
            rate, p50, p99 = med(mode, c, "rate"), med(mode, c, "p50_ms"), med(mode, c, "p99_ms")
            rates = sorted(r.rate for r in results[(mode, c)])
            spread = f" ({rates[0]:,.0f}–{rates[-1]:,.0f})" if len(rates) > 1 else ""
            errors = sum(r.errors for r in results[(mode, c)])
            err = f" ({errors} errors)" if errors else ""
            vs = ("baseline", "", "") if mode == "faust" else (ratio(rate, f_rate), ratio(p50, f_p50), ratio(p99, f_p99))
            rows.append(f"| {c} | {label}{err} | {rate:,.0f}{spread} | {p50:.2f} | {p99:.2f} | "
                        f"{med(mode, c, 'server_us_per_req'):,.0f} | {' | '.join(vs)} |")
    report.section(f"Point lookups beside Faust (one node vs one Faust worker, {ROWS:,} keys, {PARTITIONS} partitions)", [
        f"One `federator node` (HTTP on {SERVER or NodeSettings.server}) and one Faust `table_route` worker "
        f"({faust_version}, memory store, its own "
        "virtualenv; its Table's changelog topic is the store's topic, restored at start) serve the same topic "
        "on the same tansu broker, in the same run. Load: "
        f"{wrk_v}, `wrk -t1 -cN`, keep-alive connections, random keys from all {ROWS:,} "
        f"(tests/bench/wrk_point.lua); each load {SECONDS:g}s after a {WARMUP_S:g}s warm-up, {ROUNDS} rounds with "
        "the order of the servers reversed each round; figures are medians over the rounds (req/s range in "
        "brackets). Ratios: Federator's figure over Faust's at the same concurrency (req/s: higher is better; "
        "latency: lower is better). Server CPU: the Faust process or the node process; wrk, the broker and "
        "the other server share the machine.", "", *rows])
    report_routed(report, routed, from_owner, wrk_v, bare, hops)
    sql_x = med("sql", 10, "rate") / med("faust", 10, "rate")
    p99_x = med("sql", 10, "p99_ms") / med("faust", 10, "p99_ms")
    report.target(f"SQL point at c=10: req/s >= {T_SQL_VS_FAUST_RPS:g}x Faust's, p99 <= {T_SQL_VS_FAUST_P99:g}x Faust's "
                  "(issue 45)", f"{med('sql', 10, 'rate'):,.0f} vs {med('faust', 10, 'rate'):,.0f} req/s = {sql_x:.2f}x; "
                  f"p99 {med('sql', 10, 'p99_ms'):.2f} vs {med('faust', 10, 'p99_ms'):.2f} ms = {p99_x:.2f}x",
                  sql_x >= T_SQL_VS_FAUST_RPS and p99_x <= T_SQL_VS_FAUST_P99)
    rest_x = med("rest", 10, "rate") / med("sql", 10, "rate")
    report.target("REST lookup req/s >= SQL point req/s at c=10 (issues 17, 45)",
                  f"{med('rest', 10, 'rate'):,.0f} vs {med('sql', 10, 'rate'):,.0f} = {rest_x:.2f}x", rest_x >= 1)


# ---- a routed point query beside a local one, on the same node ----------------------------------
ROUTED_CLIENTS = (1, 10)
T_ROUTED_VS_LOCAL = 1.5  # routed point query's p50 and 1/rate at most this many times the local one's


def measure_routed(cluster: Cluster, root: Path) -> tuple[dict[tuple[str, int], list[WrkResult]], float]:
    """After the rounds beside Faust, n1 joins and takes half the partitions; n0 is asked the SQL
    point query for keys it holds ("local") and for keys n1 holds ("routed": n0 reads the key from
    n1 over the key port). The results by (kind, clients), and the share of the routed queries n0
    answered on its event loop from the owner (its federator_loop_server_requests_total)."""
    n0, n1 = cluster.nodes
    progress("routed point queries: a second node joins")
    n1.start()
    cluster.wait_settled("kv", PARTITIONS, timeout=120)
    owners = cluster.active_map("kv")
    files: dict[str, Path] = {}
    for kind, holder in (("local", n0.node_id), ("routed", n1.node_id)):
        keys = [key_of(i) for i in range(ROWS) if owners[partition_for(key_of(i).encode(), PARTITIONS)] == holder]
        for k in keys[:: max(1, len(keys) // 10)]:  # right answers first
            assert json.loads(post_sql(n0, POINT_SQL, [k]).data)["rows"] == [[k, value_of(int(k.split("-")[1]))]]
        files[kind] = root / f"keys-{kind}.txt"
        files[kind].write_text("".join(k + "\n" for k in keys))
    pids = [n.proc.pid for n in cluster.nodes]  # type: ignore[union-attr]
    url = f"http://{n0.endpoint}"
    out: dict[tuple[str, int], list[WrkResult]] = {}
    answered = asked = 0.0
    for rnd in range(ROUNDS):
        for c in ROUTED_CLIENTS:
            for kind in ("local", "routed") if rnd % 2 == 0 else ("routed", "local"):
                before = loop_requests(n0)
                run_wrk("warm-up", url, "sql", files[kind], c, WARMUP_S)
                r = run_wrk(f"SQL point, {kind}", url, "sql", files[kind], c, SECONDS, pids)
                out.setdefault((kind, c), []).append(r)
                progress(f"round {rnd + 1}: {r.line()}")
                if kind == "routed":
                    after = loop_requests(n0)
                    answered += after.get("from_owner", 0) - before.get("from_owner", 0)
                    asked += sum(after.values()) - sum(before.values())
    return out, answered / asked if asked else 0.0


def report_routed(report: Report, results: dict[tuple[str, int], list[WrkResult]], from_owner: float,
                  wrk_v: str, bare: list[RoundTrip], hops: dict[tuple[str, int], WrkResult]) -> None:
    def med(kind: str, c: int, attr: str) -> float:
        return statistics.median(getattr(r, attr) for r in results[(kind, c)])

    rows = ["| concurrency | server | keys | req/s | p50 ms | p99 ms | server CPU us/req | req/s vs local "
            "| p50 vs local | p50 added ms | CPU added us/req |", "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in ROUTED_CLIENTS:
        rows += _routed_rows(c, "Federator", lambda kind, attr: med(kind, c, attr),
                             {kind: sum(r.errors for r in results[(kind, c)]) for kind in ("local", "routed")})
        rows += _routed_rows(c, "bare hop (no engine)", lambda kind, attr: getattr(hops[(kind, c)], attr),
                             {kind: hops[(kind, c)].errors for kind in ("local", "routed")})
    report.section("A routed point query beside a local one (two nodes, same run, after the Faust rows)", [
        f"After the rows beside Faust, a second node (n1, HTTP on {SERVER or NodeSettings.server}) joins and takes "
        f"half the partitions. n0 is asked `{POINT_SQL}` for keys it holds (local) and for keys n1 holds (routed: "
        f"n0 reads the key's stored entry from n1 over the key port). {wrk_v}, `wrk -t1 -cN`; each load "
        f"{SECONDS:g}s after a {WARMUP_S:g}s warm-up, {ROUNDS} rounds, medians. Server CPU sums both nodes. "
        f"n0 answered {from_owner:.0%} of the routed queries on its event loop after reading "
        "the key from its owner (its federator_loop_server_requests_total, answered=\"from_owner\"); the local "
        "ones are answered at once. Two baselines of what a routed read adds, measured after the loads. The bare "
        "hop: the REST lookup's GETs (wrk, as above) to the front bench's httptools protocol on uvloop, with no "
        "query engine, which answers each at once (local) or after reading one key from another process over "
        "the key port (routed: `AsyncKeyClient` to a `KeyServer` whose read is a constant; "
        "tests/bench/bare_hop.py); server CPU sums both processes. A bare round trip between two processes (tests/bench/round_trip.py: 16 bytes echoed on "
        "a blocking socket, one at a time, no Federator code), with both processes pinned to one CPU, then to two "
        f"different ones (the scheduler puts a routed read's two nodes either way): {'; '.join(t.line() for t in bare)}.",
        "", *rows])
    worst = max(max(med("routed", c, "p50_ms") / med("local", c, "p50_ms"),
                    med("local", c, "rate") / med("routed", c, "rate")) for c in ROUTED_CLIENTS)
    report.target(f"routed SQL point <= {T_ROUTED_VS_LOCAL:g}x local (p50 and 1/rate, c=1 and c=10; issue 45)",
                  ", ".join(f"c={c}: p50 {med('routed', c, 'p50_ms'):.2f} vs {med('local', c, 'p50_ms'):.2f} ms, "
                            f"{med('routed', c, 'rate'):,.0f} vs {med('local', c, 'rate'):,.0f} req/s"
                            for c in ROUTED_CLIENTS) + f" (worst {worst:.2f}x)", worst <= T_ROUTED_VS_LOCAL)
