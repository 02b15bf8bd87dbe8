"""``make superset``: the demo (``federator demo``: broker, Spark jobs, three nodes) and Apache
Superset beside it, with Federator added as ``federator://`` and ``postgresql://``, datasets and a
dashboard; prints the URL and the login and keeps running for a person to click through.
Ctrl-C stops everything.
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from federator.broker import die_with_parent
from tests.integration import superset_env
from tests.integration.superset_api import DemoSpec, SupersetApi, provision

ROOT = Path(__file__).resolve().parents[2]
STATE = ROOT / ".federator" / "superset"
DEMO = DemoSpec(
    store="scores_per_minute", key="player", time="window_start", metric="total_score",
    virtual_name="scores_by_tier", series="tier", grain="PT1H", title="Federator demo",
    virtual_sql="SELECT s.player, s.window_start, s.total_score, "
                "CASE WHEN p.total_score >= 50000 THEN 'top players' ELSE 'the others' END AS tier "
                "FROM scores_per_minute s JOIN player_stats p ON s.player = p.player")


def start_demo() -> tuple[subprocess.Popen, str, int]:
    """``federator demo``, its output passed through until it serves: (process, node, Postgres port)."""
    demo = subprocess.Popen([sys.executable, "-m", "federator.cli", "demo"], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True, preexec_fn=die_with_parent(signal.SIGTERM))
    node = pg = None
    assert demo.stdout is not None
    for line in demo.stdout:
        print(line, end="", flush=True)
        node = node or _found(r"federator sql --url http://([\d.]+:\d+)", line)
        pg = pg or _found(r"postgresql://[\d.]+:(\d+)/", line)
        if line.startswith("==> serving"):
            break
    if node is None or pg is None:
        raise SystemExit(f"the demo stopped before serving (exit {demo.wait()})")
    return demo, node, int(pg)


def _found(pattern: str, line: str) -> str | None:
    m = re.search(pattern, line)
    return m.group(1) if m else None


def _port(preferred: int) -> int:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", preferred))
        except OSError:
            sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> int:
    stop: list[int] = []  # Ctrl-C or SIGTERM (set explicitly: a shell's background job ignores SIGINT)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, _frame: stop.append(signum))
    demo, node, pg = start_demo()
    STATE.mkdir(parents=True, exist_ok=True)
    superset_env.step("starting Superset (its log: .federator/superset/superset.log)")
    try:
        with superset_env.running(STATE, _port(8088)) as server:
            api = SupersetApi(server.url, *superset_env.ADMIN)
            site = provision(api, DEMO, f"federator://{node}", f"postgresql://superset@127.0.0.1:{pg}/federator")
            superset_env.step(f"Superset: {site.dashboard_url}  (login {superset_env.ADMIN[0]} / "
                              f"{superset_env.ADMIN[1]}); SQL Lab at {server.url}/sqllab/. Ctrl-C stops all.")
            while not stop and demo.poll() is None and server.proc.poll() is None:
                time.sleep(0.5)
    finally:
        demo.send_signal(signal.SIGTERM)
        demo.wait(60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
