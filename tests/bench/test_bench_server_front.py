"""The server front alone: where a point lookup's tail comes from when no Federator code runs.

Issue 17 asks for a SQL point p99 of at most 2 ms at 10 clients. The node serves HTTP with
granian's WSGI worker on ``--threads`` threads (16 by default) that take turns on the GIL.
This benchmark runs tests/bench/front_server.py, which holds the GIL for WORK_US of Python
per request and then answers the requested key from a table, on these fronts:

- ``wsgi, 16 threads``: the node's front with its default thread count;
- ``wsgi, 1 thread``: the same with one thread (no turns on the GIL; but a node cannot
  serve on one thread, since its queries wait on other nodes, DuckDB and query slots);
- ``granian ASGI``: granian's ASGI worker answering on its one event-loop thread, which
  granian's Rust threads hand every request (and every body read) over to;
- fronts that parse HTTP on the loop thread itself, with no hand-over (issue 45): uvicorn
  with httptools on uvloop, aiohttp's own server on one asyncio loop (Faust's front), and an
  ``asyncio.Protocol`` parsing with httptools on uvloop.

wrk (tests/bench/wrk_point.lua) loads each with GET (the REST lookup) and with POST (the SQL
point query's JSON body) at 1 and 10 connections. Nothing is asserted on timings; answers
are checked: before the load, each front answers a sample of keys (and an unknown one) over
one connection, each compared with the table; each warm-up writes every answer wrk got, and
each must be the requested key's; the measured loads must have no error. About 2.5 minutes.
FEDERATOR_BENCH_FRONT_WORK_US (default 60) sets the Python work per request,
FEDERATOR_BENCH_SECONDS (default 4) each load's length.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from federator.broker import port_open
from tests.bench.conftest import Report, progress
from tests.bench.loadgen import Conn, http_request
from tests.bench.test_bench_sql import REPO, SECONDS
from tests.bench.wrk import WrkResult, read_answers, run_wrk, wrk_binary, wrk_version
from tests.conftest import free_port, stop_process

WORK_US = float(os.environ.get("FEDERATOR_BENCH_FRONT_WORK_US", 60))
WARMUP_S = 1.0
NODE_FRONT = "wsgi, 16 threads (the node's)"
FRONTS = (  # (label, front_server flags)
    (NODE_FRONT, ["--front", "wsgi", "--threads", "16"]),
    ("wsgi, 1 thread", ["--front", "wsgi", "--threads", "1"]),
    ("granian ASGI, on its loop", ["--front", "loop"]),
    ("uvicorn (httptools, uvloop)", ["--front", "uvicorn"]),
    ("aiohttp server (asyncio)", ["--front", "aiohttp"]),
    ("asyncio protocol (httptools, uvloop)", ["--front", "protocol"]),
)

def chosen_fronts(names: str) -> tuple[tuple[str, list[str]], ...]:
    """FEDERATOR_BENCH_FRONTS picks fronts, and their order, by their --front value (``wsgi`` is the
    node's, ``wsgi1`` the one-thread WSGI), e.g. ``protocol,wsgi,uvicorn``: runs in alternating order
    tell the front's figures from the machine's drift. The node's front is always measured."""
    if not names:
        return FRONTS
    by_name = {"wsgi": FRONTS[0], "wsgi1": FRONTS[1], **{flags[1]: (label, flags) for label, flags in FRONTS[2:]}}
    picked = [by_name[name.strip()] for name in names.split(",")]
    return tuple(picked if FRONTS[0] in picked else [FRONTS[0], *picked])


FRONTS = chosen_fronts(os.environ.get("FEDERATOR_BENCH_FRONTS", ""))
LOOP_FRONTS = tuple(f for f in FRONTS if f[1][1] not in ("wsgi",))  # the fronts issue 45 compares with the node's
LOADS = (("GET", "rest"), ("POST", "sql"))  # (method, wrk_point.lua mode)
CLIENTS = (1, 10)
KEYS = 1000
T_P99_MS_C10 = 2.0  # issue 17's SQL point p99 at 10 clients


class FrontServer:
    def __init__(self, flags: list[str], keys_file: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.bench.front_server", "--port", str(self.port),
                                      "--keys", str(keys_file), "--work-us", str(WORK_US), *flags],
                                     cwd=REPO, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while not port_open("127.0.0.1", self.port, timeout=0.5):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the front server ({' '.join(flags)}) did not start listening")
            time.sleep(0.05)

    def stop(self) -> None:
        stop_process(self.proc, 10)


def request(method: str, addr: tuple[str, int], key: str) -> bytes:
    if method == "GET":
        return http_request("GET", addr, f"/v1/stores/kv/keys/{key}")
    body = json.dumps({"sql": "SELECT * FROM kv WHERE key = ?", "parameters": [key]}).encode()
    return http_request("POST", addr, "/v1/sql", body)


def check_sample(label: str, port: int, keys: list[str]) -> None:
    """A sample of keys, by GET and POST over one keep-alive connection, each answer compared with
    the table; an unknown key must get 404."""
    addr = ("127.0.0.1", port)
    conn = Conn(addr)
    try:
        for key in random.Random(5).sample(keys, 20):
            for method in ("GET", "POST"):
                status, body = conn.roundtrip(request(method, addr, key))
                assert (status, json.loads(body)) == (200, {"key": key, "value": keys.index(key)}), \
                    (label, method, key, status, body)
        for method in ("GET", "POST"):
            status, body = conn.roundtrip(request(method, addr, "no-such-key"))
            assert status == 404, (label, method, status, body)
    finally:
        conn.close()


def check_answers(label: str, answers: Path, result: WrkResult, values: dict[str, int]) -> None:
    """Every answer of a wrk load: as many as wrk counted, each the requested key's value (wrk
    draws the keys from the table's, so a right answer names one of them with its value)."""
    got = read_answers(answers)
    assert len(got) == result.requests and got, (label, len(got), result.requests)
    for status, body in got:
        answer = json.loads(body)
        assert status == 200 and answer == {"key": answer.get("key"), "value": values.get(answer.get("key"))} \
            and answer["value"] is not None, (label, status, body)


def _loadavg(load: tuple[float, float, float]) -> str:
    return " / ".join(f"{x:.2f}" for x in load)


def beats_node_front(results: dict[tuple[str, str, int], WrkResult], label: str) -> tuple[str, bool]:
    """Issue 45's test of a front: at 1 client no slower than the node's, at 10 clients faster with a
    shorter p99, for GET and POST alike."""
    parts, wins = [], True
    for method, _ in LOADS:
        one, base_one = results[(label, method, 1)], results[(NODE_FRONT, method, 1)]
        ten, base_ten = results[(label, method, 10)], results[(NODE_FRONT, method, 10)]
        wins &= one.rate >= base_one.rate and ten.rate >= base_ten.rate and ten.p99_ms < base_ten.p99_ms
        parts.append(f"{method}: 1 client {one.rate / base_one.rate:.2f}x req/s; 10 clients "
                     f"{ten.rate / base_ten.rate:.2f}x req/s, p99 {ten.p99_ms:.2f} vs {base_ten.p99_ms:.2f} ms")
    return "; ".join(parts), wins


@pytest.mark.timeout(900)
def test_server_fronts(report: Report, tmp_path) -> None:
    if wrk_binary() is None:
        pytest.skip("wrk is not installed (`make bench` installs Debian's package: apt-get install wrk)")
    keys = [f"key-{i:07d}" for i in range(KEYS)]
    values = {key: i for i, key in enumerate(keys)}
    keys_file = tmp_path / "keys.txt"
    keys_file.write_text("".join(key + "\n" for key in keys))
    results: dict[tuple[str, str, int], WrkResult] = {}
    loads: dict[tuple[str, str, int], float] = {}  # the 1-minute load average as each load began
    load_before = os.getloadavg()
    total, step = len(FRONTS) * len(LOADS) * len(CLIENTS), 0
    for label, flags in FRONTS:
        server = FrontServer(flags, keys_file)
        try:
            check_sample(label, server.port, keys)
            for method, mode in LOADS:
                for c in CLIENTS:
                    step += 1
                    answers = tmp_path / f"answers-{step}"
                    warm = run_wrk("warm-up", server.url, mode, keys_file, c, WARMUP_S, answers=answers)
                    check_answers(f"{label} {method} c={c}", answers, warm, values)
                    loads[(label, method, c)] = os.getloadavg()[0]
                    r = run_wrk(f"{label} {method}", server.url, mode, keys_file, c, SECONDS, [server.proc.pid])
                    assert r.errors == 0, r.line()
                    results[(label, method, c)] = r
                    progress(f"[{step}/{total}] {r.line()}")
        finally:
            server.stop()

    load_after = os.getloadavg()
    rows = ["| front | request | clients | req/s | p50 ms | p99 ms | server CPU us/req | req/s vs the node's front "
            "| load avg |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for (label, method, c), r in results.items():
        base = results[(NODE_FRONT, method, c)].rate
        rows.append(f"| {label} | {method} | {c} | {r.rate:,.0f} | {r.p50_ms:.2f} | {r.p99_ms:.2f} | "
                    f"{r.server_us_per_req:,.0f} | {r.rate / base:.2f}x | {loads[(label, method, c)]:.2f} |")
    report.section(f"The server front alone ({WORK_US:g} us of Python per request, no Federator code)", [
        f"tests/bench/front_server.py: each request holds the GIL for {WORK_US:g} us (a spin), then answers the "
        f"requested key's value from a table of {KEYS:,} keys (about 35 bytes of JSON). {wrk_version()}, "
        f"`wrk -t1 -cN`, keep-alive, {SECONDS:g}s per load after a {WARMUP_S:g}s warm-up whose every answer is "
        "checked. GET is the REST lookup's path, POST the SQL point query's JSON body, which each front reads "
        "and decodes. Server CPU: the server process. uvicorn, aiohttp and the protocol parse HTTP on their "
        "loop's thread; granian's ASGI loop is handed each request by granian's threads. Load avg: the machine's "
        "1-minute load average as the load began (wrk and the front make up to about 2 of it; the rest is other "
        f"work sharing the machine's cores); 1, 5 and 15 minutes: {_loadavg(load_before)} before the fronts, {_loadavg(load_after)} after.",
        "", *rows])
    for label, _ in FRONTS:
        r = results[(label, "POST", 10)]
        report.target(f"the front alone, POST p99 at 10 clients <= {T_P99_MS_C10:g} ms: {label} (issue 17)",
                      f"{r.p99_ms:.2f} ms at {r.rate:,.0f} req/s (1 client: "
                      f"{results[(label, 'POST', 1)].rate:,.0f} req/s)", r.p99_ms <= T_P99_MS_C10)
    for label, _ in LOOP_FRONTS:
        measured, wins = beats_node_front(results, label)
        report.target(f"the front alone beats the node's at 1 and 10 clients: {label} (issue 45)", measured, wins)
