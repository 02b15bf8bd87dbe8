"""The test harness's children die with a test run killed by SIGKILL: a broker and a node
started as the tests start them (tests/conftest.py, tests/integration/cluster.py) by a
process that is then killed without a chance to stop them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.integration.cluster import wait_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"  # a zombie has died
    except FileNotFoundError:
        return False


def descendants(pid: int) -> set[int]:
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True).stdout
    children: dict[int, list[int]] = {}
    for line in out.splitlines():
        p, pp = map(int, line.split())
        children.setdefault(pp, []).append(p)
    found, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            found.add(c)
            todo.append(c)
    return found


def test_a_killed_test_run_leaves_no_broker_or_node_running(tmp_path) -> None:
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(f"""
        import sys, time, uuid
        from pathlib import Path
        sys.path.insert(0, {str(ROOT)!r})
        from tests.conftest import RunningBroker, free_port
        from tests.integration.cluster import Cluster
        broker = RunningBroker(free_port(), Path({str(tmp_path / 'broker.log')!r}))
        cluster = Cluster(broker.bootstrap_servers, "h" + uuid.uuid4().hex[:8], Path({str(tmp_path / 'nodes')!r}), size=1)
        cluster.start()
        print("started", flush=True)
        time.sleep(600)
    """))
    run = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert run.stdout is not None and run.stdout.readline().strip() == "started"
        children = descendants(run.pid)
        assert len(children) >= 3, children  # the broker command, its tansu, the node
        os.kill(run.pid, signal.SIGKILL)
        run.wait(10)
        wait_for(lambda: not any(alive(p) for p in children), 30, "the broker and the node to die with the run")
    finally:
        if run.poll() is None:
            run.kill()
        for p in descendants(run.pid) | (children if "children" in locals() else set()):
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
