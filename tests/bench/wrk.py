"""wrk (Debian's package) as the benchmarks' HTTP load generator, driven by tests/bench/wrk_point.lua.

``run_wrk`` runs one closed-loop load (``-t1 -cN``, keep-alive connections) and returns what
the script's ``done()`` printed: requests, duration, errors and latency percentiles, with the
CPU the servers named by pid used meanwhile. ``make bench`` installs wrk when it is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import urllib3

from tests.bench.loadgen import cpu_seconds, stolen_seconds

LUA = Path(__file__).with_name("wrk_point.lua")


def wrk_binary() -> str | None:
    return shutil.which("wrk")


def wrk_version() -> str:
    out = subprocess.run(["wrk", "--version"], capture_output=True, text=True, timeout=10)
    return (out.stdout or out.stderr).splitlines()[0].split(" Copyright")[0].strip()


@dataclass
class WrkResult:
    label: str
    clients: int
    requests: int
    seconds: float
    errors: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    server_cpu_s: float
    stolen_s: float = 0.0  # the host's steal meanwhile (stolen_seconds)

    @property
    def stolen_cores(self) -> float:
        return self.stolen_s / self.seconds

    @property
    def rate(self) -> float:
        return (self.requests - self.errors) / self.seconds

    @property
    def server_us_per_req(self) -> float:
        return self.server_cpu_s / max(1, self.requests) * 1e6

    def line(self) -> str:
        err = f", {self.errors} errors" if self.errors else ""
        return (f"{self.label:<28} c={self.clients:<3} {self.rate:8.0f} req/s  p50 {self.p50_ms:6.2f} ms  "
                f"p99 {self.p99_ms:6.2f} ms  server CPU {self.server_us_per_req:5.0f} us/req "
                f"({self.server_cpu_s / self.seconds:.2f} cores){err}")


def run_wrk(label: str, url: str, mode: str, keys_file: Path, clients: int, seconds: float,
            server_pids: Sequence[int] = (), answers: Path | None = None, spread: Sequence[str] = ()) -> WrkResult:
    """``wrk -t1 -c<clients> -d<seconds>`` against ``url`` with wrk_point.lua's ``mode`` (faust, rest, sql, body);
    with ``answers``, every answer is written beside it (see ``read_answers``). ``spread``
    (host:port of each server): the clients take them in turn, one wrk thread each."""
    threads = clients if spread else 1
    cmd = ["wrk", f"-t{threads}", f"-c{clients}", f"-d{seconds:g}s", "--timeout", "10s", "-s", str(LUA), url,
           "--", mode, str(keys_file)]
    env = {**os.environ, **({"WRK_ANSWERS": str(answers)} if answers is not None else {}),
           **({"WRK_HOSTS": ",".join(spread)} if spread else {})}
    cpu0, stolen0 = sum(cpu_seconds(p) for p in server_pids), stolen_seconds()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60, env=env)
    cpu1, stolen1 = sum(cpu_seconds(p) for p in server_pids), stolen_seconds()
    line = next((x for x in out.stdout.splitlines() if x.startswith("WRK_JSON ")), None)
    if out.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({out.returncode}): {' '.join(cmd)}\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    d = json.loads(line.split(" ", 1)[1])
    return WrkResult(label, clients, d["requests"], d["seconds"], d["errors"], d["p50_us"] / 1000,
                     d["p99_us"] / 1000, d["max_us"] / 1000, cpu1 - cpu0, stolen1 - stolen0)


def read_answers(answers: Path) -> list[tuple[int, bytes]]:
    """Every (status, body) that a ``run_wrk(..., answers=answers)`` got, from each thread's file."""
    out: list[tuple[int, bytes]] = []
    for path in sorted(answers.parent.glob(answers.name + ".*")):
        data, i = path.read_bytes(), 0
        while i < len(data):
            head_end = data.index(b"\n", i)
            status, length = map(int, data[i:head_end].split())
            out.append((status, data[head_end + 1:head_end + 1 + length]))
            i = head_end + 2 + length
    return out


def loop_requests(node: Any) -> dict[str, float]:
    """A node's federator_loop_server_requests_total for POST /v1/sql, by how its event loop
    answered (at_once, from_owner, threads)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib3.request("GET", f"http://{node.endpoint}/metrics", timeout=10).data.decode()
    return {s.labels["answered"]: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == "federator_loop_server_requests_total" and s.labels.get("route") == "sql"}
