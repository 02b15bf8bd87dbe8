"""`federator demo`, the first Quick start command: one demo run serves the example answers, and
then is killed with SIGKILL: its nodes and broker must go with it."""

from __future__ import annotations

import collections
import re
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

from federator.demo import foreign_nodes_message
from tests.conftest import federator_cmd, free_port
from tests.integration.cluster import NodeProcess, wait_for


class Demo:
    def __init__(self, root: Path) -> None:
        self.proc = subprocess.Popen(
            federator_cmd("demo", "--events", "5000", "--port", str(free_port()), "--dir", str(root / "demo")),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        self.lines: list[str] = []
        self.serving = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if line.startswith("==> serving"):
                self.serving.set()

    @property
    def stdout(self) -> str:
        return "".join(self.lines)


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Iterator[Demo]:
    """One demo run (the Spark job makes it slow), up to the point where it serves."""
    d = Demo(tmp_path_factory.mktemp("demo"))
    try:
        deadline = time.monotonic() + 400
        while not d.serving.wait(1):
            assert d.proc.poll() is None, f"the demo exited with {d.proc.returncode}:\n{d.stdout}"
            assert time.monotonic() < deadline, f"the demo did not serve in 400 s:\n{d.stdout}"
        yield d
    finally:
        if d.proc.poll() is None:
            d.proc.terminate()
            try:
                d.proc.wait(60)
            except subprocess.TimeoutExpired:
                d.proc.kill()
                d.proc.wait()


def test_the_demo_runs_the_pipeline_and_answers(demo: Demo) -> None:
    out = demo.stdout
    assert out.count("started node") == 3
    # the answers the demo prints are the real ones from its text
    from spark.jobs.word_counts import TEXT

    counts = collections.Counter(w.lower() for w in re.findall(r"[^\W\d_]+", TEXT))
    answer = out.split("WHERE word = 'federator'")[1].splitlines()[3].split()
    assert answer == ["federator", str(counts["federator"])]
    # the leaderboard stores came from the Spark job: 5000 events' worth of players
    players = out.split("AS best FROM player_stats\n")[1].splitlines()[2].split()
    assert int(players[0]) > 0 and "player_00007" in out.split("FROM player_sessions")[1]
    # the leaderboard plugin's store answers the top-k and the rank
    rank_part = out.split("QUALIFY player = 'player_00007'")[1]
    row = rank_part.splitlines()[3].split()
    assert row[0] == "player_00007" and int(row[2]) >= 1


def _children(pid: int) -> dict[int, str]:
    """Live (not zombie) processes whose parent is ``pid``: pid -> command line."""
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _alive(int(entry.name)):
            try:
                stat = (entry / "stat").read_text()
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                if ppid == pid:
                    out[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except (OSError, ValueError, IndexError):
                continue
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the demo's children in /proc (Linux)")
def test_a_demo_killed_with_sigkill_takes_its_nodes_and_broker_with_it(demo: Demo) -> None:
    children = _children(demo.proc.pid)
    nodes = [pid for pid, cmd in children.items() if " node " in cmd]
    brokers = [pid for pid, cmd in children.items() if " broker " in cmd and pid not in nodes]
    assert len(nodes) == 3 and len(brokers) == 1, children
    # the pids the demo printed are those
    printed = {int(p) for p in re.findall(r"pid (\d+)", demo.stdout)}
    assert printed == set(nodes) | set(brokers), (printed, children)

    demo.proc.send_signal(signal.SIGKILL)
    demo.proc.wait(10)
    wait_for(lambda: not any(_alive(p) for p in children), 5, f"the demo's children {sorted(children)} to die")


def test_the_demo_names_live_nodes_it_did_not_start(broker, app_id, tmp_path) -> None:
    assert foreign_nodes_message(broker.bootstrap_servers, app_id) is None  # no membership topic yet
    node = NodeProcess(broker.bootstrap_servers, app_id, "node0", tmp_path / "node0", standby_replicas=0).start()
    try:
        message = wait_for(lambda: foreign_nodes_message(broker.bootstrap_servers, app_id), 15, "the node to beat")
        assert f"node0 at http://{node.endpoint}" in message and app_id in message
    finally:
        node.stop()
    # a node that stopped (or died a few heartbeats ago) is not live
    assert foreign_nodes_message(broker.bootstrap_servers, app_id) is None
