"""A global leaderboard's rank and top-10 in process: what the engine's path costs around the
store type's own read, which is its baseline. Real RocksDB shards, as a node stacks them, 8
partitions of 10,000 players; the engine of a one-node MemoryCluster (no HTTP, no Kafka);
each statement as the event loop asks it (``SqlEngine.answer_now``). Measured with the data
unchanged between statements, and with one new score applied before each (its CPU taken out).

Two figures per row: CPU per statement (process time, best of 5 runs of 2,000), which the
machine's load moves; and the Python opcodes it runs (a trace of 300), which it does not, so
that a change to the path shows in one run. The baseline reads the same shards with the
store type's handler in one consistent read (``read_together``), as the node does under the
engine's path.

    .venv/bin/python -m pytest tests/bench/test_bench_rank_path.py -s
"""

from __future__ import annotations

import itertools
import random
import sys
import time
from pathlib import Path
from typing import Callable

from federator.catalog import StoreDefinition
from federator.owner.duck import Duck, DuckConfig
from federator.partitioner import partition_for
from federator.sql.result import SqlRequest
from federator.store import ChangelogRecord
from federator.store.metered import Meter
from federator.store.scan_cache import ScanCache
from federator.store.shard import read_together
from federator.store.stack import open_store
from federator_plugins.leaderboard.queries import PlayerRanksQuery, TopKQuery
from tests.bench.conftest import Report, progress
from tests.registry import REGISTRY
from tests.unit.memory_cluster import Hosted, MemoryCluster

P, PLAYERS, RUNS, EACH, TRACED = 8, 10_000, 5, 2_000, 300
RANK = "SELECT player, total_score, RANK() OVER (ORDER BY total_score DESC) AS rank FROM leaderboard QUALIFY player = ?"
TOP10 = "SELECT player, total_score FROM leaderboard ORDER BY total_score DESC LIMIT 10"


class Board:
    """The leaderboard's shards under a one-node cluster's engine, and a writer of new scores."""

    def __init__(self, root: Path) -> None:
        self.defn = StoreDefinition.from_dict({
            "name": "leaderboard", "type": "leaderboard", "topic": "lb", "partitions": P, "global": True,
            "key": {"name": "player", "format": "string"}, "value": {"name": "total_score", "format": "long"},
        }, REGISTRY)
        self.rnd = random.Random(3)
        self.players = [f"player-{i:06d}" for i in range(PLAYERS)]
        records: dict[int, list[ChangelogRecord]] = {p: [] for p in range(P)}
        for player in self.players:
            kb = player.encode()
            part = records[partition_for(kb, P)]
            part.append(ChangelogRecord(kb, self._score(), len(part), 1_700_000_000_000))
        self.cluster = MemoryCluster([self.defn], Duck(DuckConfig(memory_limit="256MB", spill_dir=root)), ("me",))
        node = self.cluster.nodes["me"]
        self.shards = []
        for p in range(P):
            shard = open_store(root / f"s{p}", self.defn, p, ScanCache(64 << 20), Meter())
            shard.apply(records[p])
            self.cluster.shards[("leaderboard", p)] = node.materializer.shards[("leaderboard", p)] = shard
            self.shards.append(shard)
        hosted = {("leaderboard", p): Hosted(s) for p, s in enumerate(self.shards)}  # type: ignore[arg-type]
        node.materializer.hosted = lambda store, p: hosted.get((store, p))  # type: ignore[method-assign]
        self.offsets = [len(records[p]) for p in range(P)]
        self.engine = self.cluster.engine()

    def _score(self) -> bytes:
        return self.defn.value.serialize(self.rnd.randrange(10_000_000))

    def write(self) -> None:
        """A new score for a random player, applied as the materializer applies a record."""
        kb = self.rnd.choice(self.players).encode()
        p = partition_for(kb, P)
        self.shards[p].apply([ChangelogRecord(kb, self._score(), self.offsets[p], 1_700_000_000_000)])
        self.offsets[p] += 1

    def close(self) -> None:
        for s in self.shards:
            s.close()


def cpu_us(step: Callable[[], object]) -> float:
    """Process CPU per call of ``step``, best of RUNS runs of EACH."""
    best = float("inf")
    for _ in range(RUNS):
        started = time.process_time()
        for _ in range(EACH):
            step()
        best = min(best, time.process_time() - started)
    return best / EACH * 1e6


def opcodes(step: Callable[[], object]) -> float:
    """Python opcodes per call of ``step``, over TRACED calls."""
    count = 0

    def trace(frame, event, arg):
        nonlocal count
        frame.f_trace_opcodes = True
        if event == "opcode":
            count += 1
        return trace
    sys.settrace(trace)
    try:
        for _ in range(TRACED):
            step()
    finally:
        sys.settrace(None)
    return count / TRACED


def measured(step: Callable[[], object], write: Callable[[], None] | None) -> tuple[float, float]:
    """(CPU µs, opcodes) of ``step``; with ``write``, of ``step`` after a write, the write's own taken out."""
    if write is None:
        return cpu_us(step), opcodes(step)

    def both() -> None:
        write()
        step()
    return cpu_us(both) - cpu_us(write), opcodes(both) - opcodes(write)


def test_the_rank_path_around_its_read(report: Report, tmp_path) -> None:
    board = Board(tmp_path)
    try:
        engine, rnd = board.engine, random.Random(7)
        handlers = board.defn.store_type.together_handlers
        asked = [SqlRequest(RANK, [rnd.choice(board.players)]) for _ in range(4_000)]
        top10 = SqlRequest(TOP10)
        for req in (asked[0], top10):
            engine.execute(req)  # planned, as a node has once asked
            assert engine.answer_now(req) is not None, f"{req.sql} is not answered at once"
        each = itertools.cycle(asked)

        def rank() -> object:
            return engine.answer_now(next(each))

        def top() -> object:
            return engine.answer_now(top10)

        bases = [s.base for s in board.shards]  # the shards under their layers, as the node reads them together
        queries = itertools.cycle([PlayerRanksQuery((req.parameters[0],)) for req in asked])

        def read_rank() -> object:
            query = next(queries)
            return read_together(bases, lambda views: handlers[PlayerRanksQuery](views, query))

        def read_top() -> object:
            return read_together(bases, lambda views: handlers[TopKQuery](views, TopKQuery(10)))

        lines = ["| statement | between statements | engine path: CPU µs | opcodes | the store type's read alone: CPU µs | opcodes | path / read (CPU) |",
                 "|---|---|---:|---:|---:|---:|---:|"]
        for what, step, baseline in (("rank of a player", rank, read_rank), ("top-10", top, read_top)):
            for between, write in (("nothing written", None), ("one new score", board.write)):
                progress(f"rank path: {what}, {between}")
                path_us, path_ops = measured(step, write)
                read_us, read_ops = measured(baseline, write)
                lines.append(f"| {what} | {between} | {path_us:,.1f} | {path_ops:,.0f} | {read_us:,.1f} | "
                             f"{read_ops:,.0f} | {path_us / read_us:.1f}x |")
                progress(lines[-1])
        report.section(f"A global leaderboard's rank and top-10 in process ({PLAYERS:,} players, {P} partitions, "
                       "real RocksDB shards)", [
            *(line for part in __doc__.split("\n\n")[:2] for line in (part.replace("\n", " "), "")), *lines, "",
            "The top-10 with nothing written is a kept answer given again (no read); after a write it is "
            "the kept answer followed (its store type judges the write left it as it was) or computed again.",
        ])
    finally:
        board.close()
