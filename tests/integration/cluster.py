"""Nodes as real subprocesses (`federator node`) for integration tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import warnings
from pathlib import Path
from typing import Callable, TypeVar

import urllib3

from federator.dispatch import NodeCallError, NodeClient
from federator.query.position import Position
from tests.conftest import dies_with_tests, federator_cmd, free_port, broker_flags

T = TypeVar("T")
_HTTP = urllib3.PoolManager(maxsize=32, retries=False)


def wait_for(cond: Callable[[], T], timeout: float = 30.0, what: str = "condition", interval: float = 0.2) -> T:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = cond()
            if last:
                return last
        except (NodeCallError, OSError):
            pass
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


# How long a node has to stop on SIGTERM (hand over, leave the group, close its shards).
STOP_GRACE = 20.0


class NodeProcess:
    def __init__(self, bootstrap: str, app_id: str, node_id: str, state_dir: Path, standby_replicas: int = 1,
                 secret: str | None = None, port: int | None = None, flight_port: int | None = None,
                 server: str | None = None, pg_port: int | None = None) -> None:
        self.server = server  # `--server` (None: the default)
        self.pg_port = pg_port  # serve the Postgres protocol there too when given
        self.extra_args: list[str] = []  # more `federator node` flags
        self.bootstrap, self.app_id, self.node_id, self.state_dir = bootstrap, app_id, node_id, state_dir
        self.flight_port = flight_port  # serve Flight SQL there too when given
        self.standby_replicas, self.secret = standby_replicas, secret
        self.port = port or free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.client = NodeClient(self.endpoint, secret, timeout=10)
        self.proc: subprocess.Popen | None = None
        self.log = state_dir.parent / f"{node_id}.log"

    def start(self, wait: bool = True) -> NodeProcess:
        """Start the process; with ``wait``, return once it answers /healthz."""
        args = ["node", "--bootstrap-servers", self.bootstrap, "--application-id", self.app_id,
                "--listen", self.endpoint, "--state-dir", str(self.state_dir), "--node-id", self.node_id,
                "--standby-replicas", str(self.standby_replicas)]
        if self.flight_port:
            args += ["--flight-sql-port", str(self.flight_port)]
        if self.server:
            args += ["--server", self.server]
        if self.pg_port:
            args += ["--pg-port", str(self.pg_port)]
        args += broker_flags(self.bootstrap) + self.extra_args
        self.state_dir.parent.mkdir(parents=True, exist_ok=True)
        # faulthandler: a node that will not stop is sent SIGABRT (see finish), which writes every
        # thread's stack into its log
        env = {**os.environ, "PYTHONFAULTHANDLER": "1",
               **({"FEDERATOR_CLUSTER_SECRET": self.secret} if self.secret else {})}
        self.proc = subprocess.Popen(federator_cmd(*args), stdout=open(self.log, "a"), stderr=subprocess.STDOUT,
                                     preexec_fn=dies_with_tests(), env=env)
        if wait:
            self.wait_healthy()
        return self

    def wait_healthy(self, timeout: float = 30.0) -> None:
        wait_for(lambda: self.client.get_json("/healthz", timeout=1)[0] == 200, timeout,
                 f"{self.node_id} to answer /healthz")

    def stop(self, sig: int = signal.SIGTERM, grace: float = STOP_GRACE) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(sig)
        return self.finish(time.monotonic() + grace)

    def finish(self, deadline: float) -> int:
        """Wait for the process to end by ``deadline``; past it, have it write its threads'
        stacks into its log (SIGABRT, faulthandler), say so, and kill it. Its exit code."""
        assert self.proc is not None
        try:
            return self.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGABRT)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            warnings.warn(f"node {self.node_id} did not stop in time; its threads' stacks are at the end of {self.log}")
            return self.proc.wait()

    def metadata(self) -> dict:
        return self.client.get_json("/v1/metadata")[1]

    def ready(self) -> bool:
        return self.client.get_json("/readyz", timeout=2)[0] == 200

    def sql(self, sql: str, timeout: float = 30.0, **fields) -> tuple[int, dict]:
        """POST /v1/sql: the status and the JSON body (``fields``: consistency_token, allow_stale, ...)."""
        resp = _HTTP.request("POST", f"http://{self.endpoint}/v1/sql", json={"sql": sql, **fields}, timeout=timeout)
        try:
            return resp.status, json.loads(resp.data)
        except ValueError:
            return resp.status, {"error": {"code": None, "message": resp.data[:300].decode("utf-8", "replace")}}


class Cluster:
    def __init__(self, bootstrap: str, app_id: str, root: Path, size: int = 3, standby_replicas: int = 1,
                 secret: str | None = None, flight_sql: bool = False, servers: dict[int, str] | None = None,
                 pg: bool = False) -> None:
        self.standby_replicas = standby_replicas
        self.nodes = [
            NodeProcess(bootstrap, app_id, f"n{i}", root / f"n{i}", standby_replicas, secret,
                        flight_port=free_port() if flight_sql else None, server=(servers or {}).get(i),
                        pg_port=free_port() if pg else None)
            for i in range(size)
        ]

    def start(self) -> Cluster:
        # all at once, as an operator's nodes come up: started one after the other, each
        # waited out a node's start-up (imports, plugins) before the next began
        for n in self.nodes:
            n.start(wait=False)
        for n in self.nodes:
            n.wait_healthy()
        return self

    def stop(self, grace: float = STOP_GRACE) -> None:
        """SIGTERM every running node at once (one at a time, the others rebalanced in turn),
        then wait for them all, within one ``grace``: waiting for each in turn made two nodes
        that would not stop cost twice as long."""
        running = self.running()
        for n in running:
            n.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for n in running:
            n.finish(deadline)

    def running(self) -> list[NodeProcess]:
        return [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]

    def active_map(self, store: str, via: NodeProcess | None = None) -> dict[int, str]:
        """partition -> node id that is active for it, as the routing view says."""
        md = (via or self.running()[0]).metadata()
        out: dict[int, str] = {}
        for n in md["nodes"]:
            for p in n["active"].get(store, []):
                out[p] = n["node_id"]
        return out

    def wait_settled(self, store: str, partitions: int, timeout: float = 40.0) -> dict[int, str]:
        """Every partition active on exactly one running node, its standby copies placed and
        caught up, every running node ready and agreeing; for a global store, every partition
        kept and caught up on every running node (each partition then maps to "global": no owner)."""
        ids = {n.node_id for n in self.running()}

        def settled():
            views = [n.metadata() for n in self.running()]
            if any(md["stores"].get(store, {}).get("scope") == "global" for md in views):
                return {p: "global" for p in range(partitions)} if all(_global_copies_current(md, store, partitions, ids) for md in views) and \
                    all(n.ready() for n in self.running()) else None
            maps = []
            for md in views:
                owners: dict[int, list[str]] = {}
                for n in md["nodes"]:
                    for p in n["active"].get(store, []):
                        owners.setdefault(p, []).append(n["node_id"])
                if {n["node_id"] for n in md["nodes"]} != ids:
                    return None
                if sorted(owners) != list(range(partitions)) or any(len(v) != 1 for v in owners.values()):
                    return None
                wanted = min(self.standby_replicas, len(ids) - 1)
                for p in range(partitions):
                    copies = [n for n in md["nodes"] if p in n["standby"].get(store, [])
                              and n["lags"].get(store, {}).get(str(p)) == 0]
                    if len(copies) < wanted:
                        return None
                maps.append({p: v[0] for p, v in owners.items()})
            if any(m != maps[0] for m in maps) or not all(n.ready() for n in self.running()):
                return None
            return maps[0]

        return wait_for(settled, timeout, f"store {store} to settle on {sorted(ids)}")


def _global_copies_current(md: dict, store: str, partitions: int, ids: set[str]) -> bool:
    """Whether one node's view has every running node keeping every partition of the global
    ``store``, caught up."""
    nodes = md["nodes"]
    return {n["node_id"] for n in nodes} == ids and all(
        sorted(n.get("global", {}).get(store, [])) == list(range(partitions))
        and all(n["lags"].get(store, {}).get(str(p)) == 0 for p in range(partitions)) for n in nodes)


def write_with_token(bootstrap: str, defn, items: dict, producer=None) -> Position:
    """Upsert ``items`` (key -> value, None deletes) into a kv store's changelog, as a writer does;
    returns the Position of the writes: the consistency token that reads them back."""
    from federator import kafka
    from federator.partitioner import partition_for

    p = producer or kafka.producer(bootstrap, **{"linger.ms": 5})
    offsets: dict[int, int] = {}
    failed: list[str] = []

    def done(err, msg) -> None:
        if err is not None:
            failed.append(str(err))
        else:
            offsets[msg.partition()] = max(offsets.get(msg.partition(), -1), msg.offset())

    for k, v in items.items():
        kb = defn.key.serialize(k)
        p.produce(defn.topic, key=kb, value=None if v is None else defn.value.serialize(v),
                  partition=partition_for(kb, defn.partitions), on_delivery=done)
    assert p.flush(30) == 0 and not failed, failed
    return Position({defn.topic: offsets})


def scrape(node) -> dict[tuple[str, tuple], float]:
    """GET /metrics from ``node`` (no secret needed), every sample by name and labels."""
    from prometheus_client.parser import text_string_to_metric_families

    resp = _HTTP.request("GET", f"http://{node.endpoint}/metrics")
    assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(resp.data.decode()) for s in f.samples}


def total(samples: dict, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    return sum(v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(ls))
