"""`federator demo`, the first Quick start command: one demo run serves the example answers, and
then is killed with SIGKILL: its nodes and broker must go with it."""

from __future__ import annotations

import collections
import datetime as dt
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest
import urllib3

from federator.demo import EXAMPLES, foreign_nodes_message
from tests.conftest import federator_cmd, free_port, stop_process
from tests.integration.cluster import NodeProcess, wait_for
from tests.threads import Worker, join_all


class Demo:
    def __init__(self, root: Path) -> None:
        self.proc = subprocess.Popen(
            federator_cmd("demo", "--events", "5000", "--port", str(free_port()), "--dir", str(root / "demo")),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        self.root = root
        self.lines: list[str] = []
        self.serving = threading.Event()
        self.reader = Worker(self._read, name="demo stdout")
        self.reader.start()

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
            if not d.reader.is_alive():
                join_all([d.reader], 0)  # what stopped the reader, if it failed
            assert d.proc.poll() is None, f"the demo exited with {d.proc.returncode}:\n{d.stdout}"
            assert time.monotonic() < deadline, f"the demo did not serve in 400 s:\n{d.stdout}"
        yield d
    finally:
        stop_process(d.proc, 60)


def printed(out: str, sql: str) -> tuple[list[str], list[list[str]]]:
    """The header and rows of the table the demo printed under ``sql``."""
    lines = out.split(f"\n  {sql}\n", 1)[1].splitlines()
    assert lines[1].strip().startswith("---"), lines[:3]
    rows = []
    for line in lines[2:]:
        if line.strip().startswith("("):
            break
        rows.append(re.split(r"\s{2,}", line.strip()))
    return re.split(r"\s{2,}", lines[0].strip()), rows


def ms(printed_time: str) -> int:
    """'2024-01-01T01:35:00.000000Z' as epoch milliseconds."""
    return round(dt.datetime.fromisoformat(printed_time.replace("Z", "+00:00")).timestamp() * 1000)


# What the demo answers, every run: `federator demo --events 5000` generates its game events from
# a fixed seed (federator_spark.jobs.game_events, seed 42), so the stores hold exactly these. A change to the
# generator or the jobs changes them: check the new answers against the events (the second half
# of the test does) and write them here.
PLAYERS, POINTS, BEST = 50, 2_512_421, 999
TOP_PLAYERS = [["player_00039", 62648, 999, 20], ["player_00041", 61746, 994, 20], ["player_00015", 57301, 999, 20],
               ["player_00029", 57031, 997, 20], ["player_00035", 55702, 998, 20]]
T0 = 1_704_067_200_000  # 2024-01-01T00:00:00Z
MIN = 60_000
P7_MINUTES = [[T0 + 95 * MIN, 261], [T0 + 97 * MIN, 772], [T0 + 132 * MIN, 341]]  # player_00007's first 3
P7_SESSIONS = [[T0 + 95 * MIN + 23_648, T0 + 97 * MIN + 25_596, 2], [T0 + 132 * MIN + 30_571, T0 + 196 * MIN + 26_583, 6],
               [T0 + 226 * MIN + 37_793, T0 + 325 * MIN + 26_059, 5]]
P7_RANK = ["player_00007", 40493, 48]


def test_the_demo_runs_the_pipeline_and_answers(demo: Demo) -> None:
    out = demo.stdout
    assert out.count("started node") == 3
    # the answers the demo prints are the real ones from its text
    from federator_spark.jobs.word_counts import TEXT

    counts = collections.Counter(w.lower() for w in re.findall(r"[^\W\d_]+", TEXT))
    assert printed(out, EXAMPLES[0])[1] == [["federator", str(counts["federator"])]]
    top_words = sorted(counts.items(), key=lambda wc: (-wc[1], wc[0]))[:5]
    assert printed(out, EXAMPLES[1])[1] == [[w, str(c)] for w, c in top_words]

    # the game stores, from the Spark job over the seeded events: exactly the known answers
    def ints(rows: list[list[str]], *text_columns: int) -> list[list]:
        return [[v if i in text_columns else int(v) for i, v in enumerate(r)] for r in rows]

    assert ints(printed(out, EXAMPLES[2])[1], 0) == TOP_PLAYERS
    assert ints(printed(out, EXAMPLES[3])[1]) == [[PLAYERS, POINTS, BEST]]
    assert [[r[0], ms(r[1]), int(r[2])] for r in printed(out, EXAMPLES[4])[1]] == \
        [["player_00007", *m] for m in P7_MINUTES]
    assert [[r[0], ms(r[1]), ms(r[2]), int(r[3])] for r in printed(out, EXAMPLES[5])[1]] == \
        [["player_00007", *s] for s in P7_SESSIONS]
    # the leaderboard plugin's store answers the top-k and the rank
    assert ints(printed(out, EXAMPLES[6])[1], 0) == [r[:2] for r in TOP_PLAYERS[:3]]
    assert ints(printed(out, EXAMPLES[7])[1], 0) == [P7_RANK]
    # the Postgres client the demo names answers the same (psql as printed, when Debian's is installed)
    m = re.search(r"psql (postgresql://\S+)", out)
    assert m is not None, out
    if shutil.which("psql"):
        done = subprocess.run(["psql", m.group(1), "-X", "-A", "-t", "-c", EXAMPLES[2]], capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert ints([line.split("|") for line in done.stdout.split()], 0) == TOP_PLAYERS

    # and those known answers are what the demo's events give (DuckDB over the Parquet it wrote)
    import duckdb

    db = duckdb.connect()
    db.execute("SET TimeZone = 'UTC'")
    db.execute(f"CREATE VIEW ev AS SELECT player, game, score, epoch_ms(ts) AS t "
               f"FROM read_parquet('{demo.root / 'demo' / 'game_events'}/*.parquet')")
    assert db.execute("SELECT COUNT(*) FROM ev").fetchone() == (5000,)
    stats = ("SELECT player, SUM(score) AS total, MAX(score) AS best, COUNT(DISTINCT game) AS games "
             "FROM ev GROUP BY player")
    assert db.execute(f"SELECT COUNT(*), SUM(total), MAX(best) FROM ({stats})").fetchone() == (PLAYERS, POINTS, BEST)
    assert [list(r) for r in db.execute(f"{stats} ORDER BY total DESC LIMIT 5").fetchall()] == TOP_PLAYERS
    assert [list(r) for r in db.execute(f"SELECT player, total, rank FROM (SELECT player, total, "
                                        f"RANK() OVER (ORDER BY total DESC) AS rank FROM ({stats})) "
                                        "WHERE player = 'player_00007'").fetchall()] == [P7_RANK]
    assert [list(r) for r in db.execute(
        f"SELECT t - t % {MIN} AS w, SUM(score) FROM ev WHERE player = 'player_00007' GROUP BY w ORDER BY w LIMIT 3"
    ).fetchall()] == P7_MINUTES
    sessions = db.execute(f"""
        WITH e AS (SELECT t, CASE WHEN t - lag(t) OVER (ORDER BY t) >= 30 * {MIN} THEN 1 ELSE 0 END AS gap
                   FROM ev WHERE player = 'player_00007'),
             s AS (SELECT t, SUM(gap) OVER (ORDER BY t ROWS UNBOUNDED PRECEDING) AS session FROM e)
        SELECT MIN(t), MAX(t), COUNT(*) FROM s GROUP BY session ORDER BY 1 LIMIT 3""").fetchall()
    assert [list(r) for r in sessions] == P7_SESSIONS


def test_the_demos_leaderboard_is_global_and_its_other_stores_partitioned(demo: Demo) -> None:
    """Every node keeps the whole leaderboard, so the node asked ranks a player alone."""
    node = re.findall(r"started node\d at http://(\S+),", demo.stdout)[0]
    r = urllib3.request("POST", f"http://{node}/v1/sql", json={
        "sql": "SELECT table_name, scope FROM information_schema.tables ORDER BY table_name"}, timeout=30)
    assert r.status == 200, r.data
    assert dict(r.json()["rows"]) == {"leaderboard": "global", "player_sessions": "partitioned",
                                      "player_stats": "partitioned", "scores_per_minute": "partitioned",
                                      "word_counts": "partitioned"}


def test_the_docs_examples_run_against_the_demo(demo: Demo) -> None:
    """Every block README.md and docs/ mark <!-- run --> runs against this demo (its first node
    plays 127.0.0.1:8080, its second 127.0.0.1:8081, its Postgres port 127.0.0.1:5432, its Flight
    SQL port 127.0.0.1:32010); a block's <!-- output --> is its exact output. A renamed flag or a
    changed answer fails here."""
    from tests.docs_blocks import all_blocks

    out = demo.stdout
    nodes = re.findall(r"started node\d at http://(\S+),", out)
    pg = re.search(r"psql postgresql://(\S+?)/federator", out)
    flight = re.search(r"grpc://(\S+)", out)
    assert len(nodes) == 3 and pg is not None and flight is not None, out
    places = {"127.0.0.1:8080": nodes[0], "127.0.0.1:8081": nodes[1], "127.0.0.1:5432": pg.group(1),
              "127.0.0.1:32010": flight.group(1)}

    def placed(code: str) -> str:
        for doc, real in places.items():
            code = code.replace(doc, real)
        return code

    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    ran = []
    for block in (b for b in all_blocks() if b.marker == "run"):
        code = placed(block.code)
        if block.lang == "sh":
            done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", code], env=env, capture_output=True,
                                  text=True, timeout=120)
        elif block.lang == "python":
            done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        elif block.lang == "sql":
            if not shutil.which("psql"):
                continue
            done = subprocess.run(["psql", f"postgresql://{places['127.0.0.1:5432']}/federator", "-X", "-v",
                                   "ON_ERROR_STOP=1"], input=code, env=env, capture_output=True, text=True, timeout=120)
        else:
            raise AssertionError(f"{block.where}: no way to run a {block.lang!r} block")
        assert done.returncode == 0, f"{block.where} failed:\n{code}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        if block.output is not None:
            assert done.stdout.rstrip() == block.output.rstrip(), f"{block.where}: its output changed:\n{done.stdout}"
        ran.append(block.where)
    assert len(ran) >= 8, ran


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

