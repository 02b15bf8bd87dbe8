"""What a global store costs each node: restoring it on a new node, and the memory and disk it
takes there; on a real broker and real node subprocesses.

A global kv store of ROWS players (key string ``key-0000000`` ... -> score long, Kafka's
LongSerializer), PARTITIONS partitions, is produced first. Then:

1. a node of an application with no stores: its RSS is the baseline of an idle node;
2. a new node of the store's application: the time from its start to ``/readyz`` (every
   partition of the global store restored from the changelog), its RSS less the baseline, and
   the size of the store's RocksDB directories under its state dir; then ``SELECT COUNT(*)``
   and a key lookup there (what the first reads cost);
3. a second new node beside the first (a node joining late), timed the same way;
4. the first node restarted: the time to ``/readyz`` again, from its checkpoint (nothing to
   read but what came after it).

Nothing here asserts on timings: the figures are printed and appended to tests/bench/results.md.
FEDERATOR_BENCH_GLOBAL_ROWS (default 1,000,000) sizes the store; FEDERATOR_BENCH_RESULTS=/tmp/x.md
keeps a quick look out of results.md.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

import pytest

from tests.bench.conftest import Report, progress
from tests.bench.test_bench_join import status_kb
from tests.bench.test_bench_sql import key_of, post_sql, produce_kv
from tests.integration.changelog_util import register
from tests.integration.cluster import NodeProcess, wait_for

ROWS = int(os.environ.get("FEDERATOR_BENCH_GLOBAL_ROWS", 1_000_000))
PARTITIONS = 8
SETTLE_SECONDS = 3.0  # after /readyz, before RSS is read: the first beats and checks done


def disk_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def started_until_ready(node: NodeProcess) -> float:
    """Seconds from the process's start to its /readyz answering 200 (its copies restored)."""
    began = time.perf_counter()
    node.start(wait=False)
    wait_for(lambda: node.client.get_json("/readyz", timeout=1)[0] == 200, 1800, f"{node.node_id} to be ready",
             interval=0.05)
    return time.perf_counter() - began


def rss_mb(node: NodeProcess) -> float:
    time.sleep(SETTLE_SECONDS)
    return status_kb(node.proc.pid, "VmRSS") / 1024  # type: ignore[union-attr]


@pytest.mark.timeout(3600)
def test_restoring_a_global_store_and_its_memory_and_disk_per_node(broker, tmp_path, report: Report) -> None:
    bootstrap = broker.bootstrap_servers
    app = f"gbench{uuid.uuid4().hex[:6]}"
    defn = register(broker, app, {"name": "ranks", "type": "kv", "partitions": PARTITIONS, "global": True,
                                  "key": {"name": "player", "format": "string"}, "value": {"name": "score", "format": "long"}})
    progress(f"producing {ROWS:,} rows into the global store")
    produced = produce_kv(bootstrap, defn.topic, ROWS, lambda i: (i * 7919) % 100_003)

    idle = NodeProcess(bootstrap, f"gbench-idle{uuid.uuid4().hex[:6]}", "idle", tmp_path / "idle", standby_replicas=0)
    first = NodeProcess(bootstrap, app, "g1", tmp_path / "g1", standby_replicas=0)
    late = NodeProcess(bootstrap, app, "g2", tmp_path / "g2", standby_replicas=0)
    rows: list[str] = []
    try:
        idle.start()
        baseline = rss_mb(idle)
        idle.stop()
        progress("a new node restores the store")
        restore = started_until_ready(first)
        memory = rss_mb(first) - baseline
        disk = disk_bytes(first.state_dir / "ranks")
        reads = []
        for sql in ("SELECT COUNT(*) FROM ranks", f"SELECT score FROM ranks WHERE player = '{key_of(ROWS // 2)}'"):
            began = time.perf_counter()
            body = json.loads(post_sql(first, sql).data)
            reads.append((sql, (time.perf_counter() - began) * 1000, body["rows"]))
        assert reads[0][2] == [[ROWS]]
        rows.append(f"| a new node (no other) | {restore:.1f} | {ROWS / restore:,.0f} | {memory:,.0f} | "
                    f"{memory * 2**20 / ROWS:,.0f} | {disk / 2**20:,.1f} | {disk / ROWS:,.0f} |")
        progress("a second node joins late")
        restore2 = started_until_ready(late)
        memory2 = rss_mb(late) - baseline
        disk2 = disk_bytes(late.state_dir / "ranks")
        rows.append(f"| a node joining late (one running) | {restore2:.1f} | {ROWS / restore2:,.0f} | {memory2:,.0f} | "
                    f"{memory2 * 2**20 / ROWS:,.0f} | {disk2 / 2**20:,.1f} | {disk2 / ROWS:,.0f} |")
        progress("the first node restarts from its checkpoint")
        first.stop()
        again = started_until_ready(first)
        rows.append(f"| the first node restarted (from its checkpoint) | {again:.1f} | | {rss_mb(first) - baseline:,.0f} "
                    f"| | {disk_bytes(first.state_dir / 'ranks') / 2**20:,.1f} | |")
    finally:
        for node in (idle, first, late):
            node.stop()
    report.section(f"Restoring a global store: {ROWS:,} rows, {PARTITIONS} partitions, on each new node", [
        f"A global kv store of {ROWS:,} players (string key of 11 bytes -> long score), produced in {produced:.1f} s. "
        "Restore: from the node's start to its /readyz (every partition read from the changelog into RocksDB). "
        f"Memory: the node's RSS {SETTLE_SECONDS:.0f} s after /readyz less an idle node's ({baseline:,.0f} MB). "
        "Disk: the store's RocksDB directories under the node's state dir.",
        "",
        "| node | restore s | rows/s | memory MB | memory bytes/row | disk MB | disk bytes/row |",
        "|---|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
        *(f"- `{sql}` on the new node, first ask: {ms:.1f} ms" for sql, ms, _ in reads),
    ])
