"""The server front alone: where a point lookup's tail comes from when no Federator code runs.

Issue 17 asks for a SQL point p99 of at most 2 ms at 10 clients. The node serves HTTP with
granian's WSGI worker on ``--threads`` threads (16 by default) that take turns on the GIL.
This benchmark runs tests/bench/front_server.py, which holds the GIL for WORK_US of Python
per request and answers a fixed body, on three fronts:

- ``wsgi, 16 threads``: the node's front with its default thread count;
- ``wsgi, 1 thread``: the same with one thread (no turns on the GIL; but a node cannot
  serve on one thread, since its queries wait on other nodes, DuckDB and query slots);
- ``event loop``: granian's ASGI worker answering on its one event-loop thread, the front a
  node would need to answer point lookups in arrival order without threads (what waits
  would go to threads; see docs/explanation/speed.md).

wrk (tests/bench/wrk_point.lua) loads each with GET and with POST (a JSON body, as
``POST /v1/sql``) at 1 and 10 connections. Nothing is asserted on timings. About a minute.
FEDERATOR_BENCH_FRONT_WORK_US (default 60) sets the Python work per request,
FEDERATOR_BENCH_SECONDS (default 4) each load's length.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from federator.broker import port_open
from tests.bench.conftest import Report, progress
from tests.bench.test_bench_sql import REPO, SECONDS
from tests.bench.wrk import WrkResult, run_wrk, wrk_binary, wrk_version
from tests.conftest import free_port, stop_process

WORK_US = float(os.environ.get("FEDERATOR_BENCH_FRONT_WORK_US", 60))
WARMUP_S = 1.0
FRONTS = (  # (label, front_server flags)
    ("wsgi, 16 threads (the node's)", ["--front", "wsgi", "--threads", "16"]),
    ("wsgi, 1 thread", ["--front", "wsgi", "--threads", "1"]),
    ("event loop (ASGI)", ["--front", "loop"]),
)
LOADS = (("GET", "rest"), ("POST", "sql"))  # (method, wrk_point.lua mode)
CLIENTS = (1, 10)
T_P99_MS_C10 = 2.0  # issue 17's SQL point p99 at 10 clients


class FrontServer:
    def __init__(self, flags: list[str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.bench.front_server", "--port", str(self.port),
                                      "--work-us", str(WORK_US), *flags], cwd=REPO, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while not port_open("127.0.0.1", self.port, timeout=0.5):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the front server ({' '.join(flags)}) did not start listening")
            time.sleep(0.05)

    def stop(self) -> None:
        stop_process(self.proc, 10)


@pytest.mark.timeout(600)
def test_server_fronts(report: Report, tmp_path) -> None:
    if wrk_binary() is None:
        pytest.skip("wrk is not installed (`make bench` installs Debian's package: apt-get install wrk)")
    keys_file = tmp_path / "keys.txt"
    keys_file.write_text("".join(f"key-{i:07d}\n" for i in range(1000)))
    results: dict[tuple[str, str, int], WrkResult] = {}
    total, step = len(FRONTS) * len(LOADS) * len(CLIENTS), 0
    for label, flags in FRONTS:
        server = FrontServer(flags)
        try:
            for method, mode in LOADS:
                for c in CLIENTS:
                    step += 1
                    run_wrk("warm-up", server.url, mode, keys_file, c, WARMUP_S)
                    r = run_wrk(f"{label} {method}", server.url, mode, keys_file, c, SECONDS, [server.proc.pid])
                    results[(label, method, c)] = r
                    progress(f"[{step}/{total}] {r.line()}")
        finally:
            server.stop()

    rows = ["| front | request | clients | req/s | p50 ms | p99 ms | server CPU us/req | req/s vs the node's front |",
            "|---|---|---:|---:|---:|---:|---:|---:|"]
    node_front = FRONTS[0][0]
    for (label, method, c), r in results.items():
        base = results[(node_front, method, c)].rate
        rows.append(f"| {label} | {method} | {c} | {r.rate:,.0f} | {r.p50_ms:.2f} | {r.p99_ms:.2f} | "
                    f"{r.server_us_per_req:,.0f} | {r.rate / base:.2f}x |")
    report.section(f"The server front alone ({WORK_US:g} us of Python per request, no Federator code)", [
        f"tests/bench/front_server.py: each request holds the GIL for {WORK_US:g} us (a spin), then answers a "
        f"35-byte JSON body. {wrk_version()}, `wrk -t1 -cN`, keep-alive, {SECONDS:g}s per load after a "
        f"{WARMUP_S:g}s warm-up. POST sends the SQL point query's JSON body, which the event-loop front reads "
        "before answering. Server CPU: the server process.", "", *rows])
    for label, _ in FRONTS:
        r = results[(label, "POST", 10)]
        report.target(f"the front alone, POST p99 at 10 clients <= {T_P99_MS_C10:g} ms: {label} (issue 17)",
                      f"{r.p99_ms:.2f} ms at {r.rate:,.0f} req/s (1 client: "
                      f"{results[(label, 'POST', 1)].rate:,.0f} req/s)", r.p99_ms <= T_P99_MS_C10)
