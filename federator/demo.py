"""`federator demo`: the main job on embedded defaults.

It starts the local broker, runs the Spark jobs (word counts, and the game-events
leaderboard: player_stats, scores_per_minute, player_sessions, leaderboard), starts three nodes that
share the partitions (with standby copies), and answers example SQL over HTTP.

Everything it starts dies with it, however it dies (SIGKILL included): each child gets
PR_SET_PDEATHSIG (see ``die_with_parent``). It will not share its application with a node it did
not start: a live one found there (an earlier demo's?) stops it with that node's id and address.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import urllib3

from federator.broker import TANSU_NODE_FLAGS, BrokerError, BrokerProcess, die_with_parent
from federator.client.sql_cli import format_table

APP = "federator-demo"
REPO_ROOT = Path(__file__).resolve().parents[1]


def step(msg: str) -> None:
    print(f"==> {msg}", flush=True)


def run_demo(args: argparse.Namespace) -> int:
    state = Path(args.dir).resolve()
    if state.exists():
        shutil.rmtree(state)  # the broker keeps nothing across runs, so neither do the shards
    state.mkdir(parents=True)
    if args.bootstrap_servers:
        return _on_a_cluster(args, state)
    log = open(state / "broker.log", "w")
    step(f"starting the local broker on 127.0.0.1:{args.port} (log: {state / 'broker.log'})")
    broker = BrokerProcess("127.0.0.1", args.port, output=log)  # it dies with us (PR_SET_PDEATHSIG)
    try:
        broker.start()
    except BrokerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    step(f"broker ready (pid {broker.proc.pid})")  # type: ignore[union-attr]
    try:
        return _pipeline(broker.bootstrap_servers, state, args, [], TANSU_NODE_FLAGS)
    finally:
        broker.stop()
        log.close()


def _on_a_cluster(args: argparse.Namespace, state: Path) -> int:
    """The demo on the user's Kafka cluster: its jobs and nodes get --kafka-config too."""
    from federator import kafka, kafka_properties

    flags = []
    if args.kafka_config:
        kafka.use_client_properties(args.bootstrap_servers, kafka_properties.load(args.kafka_config))
        flags = ["--kafka-config", str(Path(args.kafka_config).resolve())]
    kafka.check_reachable(args.bootstrap_servers)
    step(f"running on the Kafka cluster at {args.bootstrap_servers}")
    return _pipeline(args.bootstrap_servers, state, args, flags, [])


def _pipeline(bootstrap: str, state: Path, args: argparse.Namespace, kafka_flags: list[str],
              broker_flags: list[str]) -> int:
    """The jobs, then the nodes; ``kafka_flags`` (--kafka-config) for both, ``broker_flags`` (what
    suits the broker) for the nodes."""
    step("running the Spark jobs word_counts and game_events (local[2], one Spark session; their progress follows)")
    cmd = [sys.executable, "-m", "federator_spark.jobs.pipeline", "--bootstrap-servers", bootstrap, "--application-id", APP,
           "--master", "local[2]", "--events", str(args.events), "--game-input", str(state / "game_events"),
           *kafka_flags]
    log = state / "spark.log"
    # the job's JVM exits when its Python driver does (it reads the driver's stdin)
    done = subprocess.run(cmd, cwd=REPO_ROOT, stdout=sys.stdout, stderr=open(log, "w"),
                          preexec_fn=die_with_parent(signal.SIGTERM))
    if done.returncode != 0:
        print(f"error: the Spark jobs failed; their log is {log}", file=sys.stderr)
        return 1

    foreign = foreign_nodes_message(bootstrap, APP)
    if foreign is not None:
        print(f"error: {foreign}", file=sys.stderr)
        return 1
    pg_port, flight_port = _port_or_free(5432), _port_or_free(32010)
    nodes = _start_nodes(bootstrap, state, pg_port, flight_port, [*kafka_flags, *broker_flags])
    try:
        step("asking the nodes in SQL over HTTP (POST /v1/sql)")
        url = f"http://{nodes[0][1]}"
        for sql in EXAMPLES:
            columns, rows, stats = _sql(url, sql)
            print(f"\n  {sql}")
            print("    " + format_table(columns, rows, stats).replace("\n", "\n    "))
        print(f"\n  try: federator sql --url {url} \"SELECT * FROM word_counts ORDER BY count DESC LIMIT 5\"")
        print(f"  or open the console in a browser: {url}/")
        print(f"  or connect a Postgres client (psql, DBeaver, Grafana): psql postgresql://127.0.0.1:{pg_port}/federator")
        print(f"  or a Flight SQL driver (ADBC, JDBC): grpc://127.0.0.1:{flight_port}")
        return _serve_or_exit(args, nodes, url, bootstrap, state)
    finally:
        for proc, _ in nodes:
            proc.terminate()
        for proc, _ in nodes:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()


EXAMPLES = [
    "SELECT word, count FROM word_counts WHERE word = 'federator'",
    "SELECT word, count FROM word_counts ORDER BY count DESC, word LIMIT 5",
    "SELECT player, total_score, best_score, games FROM player_stats ORDER BY total_score DESC LIMIT 5",
    "SELECT COUNT(*) AS players, SUM(total_score) AS points, MAX(best_score) AS best FROM player_stats",
    "SELECT player, window_start, total_score FROM scores_per_minute WHERE player = 'player_00007' ORDER BY window_start LIMIT 3",
    "SELECT player, window_start, window_end, games FROM player_sessions WHERE player = 'player_00007' ORDER BY window_start LIMIT 3",
    # the leaderboard plugin: a per-partition top-k over its score index, and a player's rank
    "SELECT player, total_score FROM leaderboard ORDER BY total_score DESC LIMIT 3",
    "SELECT player, total_score, RANK() OVER (ORDER BY total_score DESC) AS rank FROM leaderboard "
    "QUALIFY player = 'player_00007'",
]


def foreign_nodes_message(bootstrap: str, app: str) -> str | None:
    """Why the demo must not start its nodes: live nodes it did not start in its application
    (say, ones an earlier demo left running). None when there are none."""
    from federator.cluster.membership import read_live_nodes

    live = read_live_nodes(bootstrap, app)
    if not live:
        return None
    names = ", ".join(f"{n.node_id} at http://{n.endpoint}" for n in live)
    return (f"live nodes that this demo did not start are in its application {app!r} on {bootstrap}: {names}. "
            "They would mix with the demo's own nodes; stop them (an earlier demo's?) and run the demo again")


def _start_nodes(bootstrap: str, state: Path, pg_port: int, flight_port: int,
                 flags: list[str]) -> list[tuple[subprocess.Popen, str]]:
    """Three nodes; the first also serves the Postgres protocol on ``pg_port`` and Flight SQL on ``flight_port``."""
    nodes = []
    for i in range(3):
        port = _port_or_free(8080) if i == 0 else _free_port()
        endpoint = f"127.0.0.1:{port}"
        log = open(state / f"node{i}.log", "w")
        cmd = [sys.executable, "-m", "federator.cli", "node", "--bootstrap-servers", bootstrap, "--application-id", APP,
               "--listen", endpoint, "--state-dir", str(state / f"node{i}"), "--node-id", f"node{i}",
               "--standby-replicas", "1", *flags] + (
            ["--pg-port", str(pg_port), "--flight-sql-port", str(flight_port)] if i == 0 else [])
        # SIGKILL when the demo dies: its broker goes too, so there is nothing to hand over to
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent(signal.SIGKILL))
        nodes.append((proc, endpoint))
        step(f"started node{i} at http://{endpoint}, pid {proc.pid} (log: {state / f'node{i}.log'})")
    step("waiting for the nodes to share the partitions and restore their shards")
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        ready = [_ready(ep) for _, ep in nodes]
        if all(ready):
            return nodes
        for proc, ep in nodes:
            if proc.poll() is not None:
                raise RuntimeError(f"the node at {ep} exited with code {proc.returncode}; see its log in {state}")
        time.sleep(0.5)
    raise RuntimeError(f"the nodes were not ready within 90s; see their logs in {state}")


def _port_or_free(preferred: int) -> int:
    """``preferred`` when nothing listens there (the docs' examples name 8080, 5432 and 32010), else any free port."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", preferred))
            return preferred
        except OSError:
            pass
    return _free_port()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _ready(endpoint: str) -> bool:
    try:
        return urllib3.request("GET", f"http://{endpoint}/readyz", timeout=2).status == 200
    except urllib3.exceptions.HTTPError:
        return False


def _sql(url: str, sql: str) -> tuple[list, list, dict]:
    resp = urllib3.request("POST", f"{url}/v1/sql", json={"sql": sql}, timeout=30)
    body = json.loads(resp.data)
    if resp.status != 200:
        raise RuntimeError(f"{sql}: {body['error']['code']}: {body['error']['message']}")
    return body["columns"], body["rows"], body["stats"]


def _serve_or_exit(args: argparse.Namespace, nodes, url: str, bootstrap: str, state: Path) -> int:
    if args.exit:
        step("done (--exit)")
        return 0
    step(f"serving: SQL at {url}/v1/sql on every node; broker {bootstrap}; state in {state}. Ctrl-C stops.")
    stop = False

    def on_signal(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while not stop:
        time.sleep(0.2)
    return 0
