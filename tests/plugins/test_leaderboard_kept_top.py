"""A partitioned leaderboard's top-k and players' ranks asked again after writes: each
partition's top k, and its scores, are kept beside its state, so the engine reads again only
the partitions the writes moved (and, for a rank, the player's own), and every answer is still
DuckDB's over the scores as written.

Over a one-node cluster in one process (tests/unit/memory_cluster.py) whose leaderboard is held
in real RocksDB shards, as a node keeps them; the engine's calls are counted per partition."""

from __future__ import annotations

import random

import duckdb
import pyarrow as pa

from federator.catalog import StoreDefinition
from federator.owner.duck import Duck, DuckConfig
from federator.partitioner import partition_for
from federator.sql.result import SqlRequest
from federator.store import ChangelogRecord, Shard
from tests.registry import REGISTRY
from tests.unit.memory_cluster import MemoryCluster

P = 4
TOP = "SELECT player, score FROM board ORDER BY score DESC, player LIMIT 5"
RANK = "SELECT player, score, {f} OVER (ORDER BY score DESC) AS r FROM board QUALIFY player = ?"


class Board:
    """A partitioned leaderboard in real shards, a one-node cluster's engine over it, and its
    rows for DuckDB."""

    def __init__(self, root) -> None:
        self.defn = StoreDefinition.from_dict({
            "name": "board", "type": "leaderboard", "topic": "app-board-changelog", "partitions": P,
            "key": {"name": "player", "format": "string"}, "value": {"name": "score", "format": "long"}}, REGISTRY)
        self.cluster = MemoryCluster([self.defn], Duck(DuckConfig(memory_limit="256MB", spill_dir=root)), ("me",))
        self.shards = [Shard(root / f"s{p}", self.defn, p) for p in range(P)]
        for p, shard in enumerate(self.shards):
            self.cluster.shards[("board", p)] = self.cluster.nodes["me"].materializer.shards[("board", p)] = shard
        self.scores: dict[str, int] = {}
        self.offsets = [0] * P
        self.engine = self.cluster.engine()

    def write(self, player: str, score: int) -> int:
        kb = player.encode()
        p = partition_for(kb, P)
        self.shards[p].apply([ChangelogRecord(kb, self.defn.value.serialize(score), self.offsets[p], 1_700_000_000_000)])
        self.offsets[p] += 1
        self.scores[player] = score
        return p

    def expected(self, text: str, params: list) -> list[tuple]:
        table = pa.table({"player": list(self.scores), "score": pa.array(list(self.scores.values()), pa.int64())})
        return duckdb.connect().register("board", table).execute(text, params).fetchall()

    def answer(self, text: str, params: list) -> list[tuple]:
        got = self.engine.execute(SqlRequest(text, params))
        return [tuple(r.values()) for r in pa.Table.from_batches(list(got.batches)).to_pylist()]

    def asked(self) -> list[int]:
        return sorted(p for r in self.cluster.requests() for p in r.partitions or range(P))

    def close(self) -> None:
        self.cluster.close()
        for shard in self.shards:
            shard.close()


def test_a_partitioned_top_k_reads_again_only_the_partitions_writes_moved(tmp_path) -> None:
    board = Board(tmp_path)
    rnd = random.Random(7)
    try:
        for i in range(200):
            board.write(f"p{i:03d}", rnd.randrange(1_000))
        assert board.answer(TOP, []) == board.expected(TOP, [])
        assert board.asked() == list(range(P))
        for _ in range(30):
            board.cluster.forget()
            moved = board.write(f"p{rnd.randrange(260):03d}", rnd.randrange(1_100))  # some players new, some past the top
            assert board.answer(TOP, []) == board.expected(TOP, [])
            assert board.asked() == [moved]  # the other partitions' top 5 given again
    finally:
        board.close()


def test_a_partitioned_rank_reads_the_players_partition_and_the_others_moved(tmp_path) -> None:
    """The player's partition is asked on every rank; another only when a write moved it
    since its scores were kept (or none were)."""
    board = Board(tmp_path)
    rnd = random.Random(11)
    try:
        for i in range(200):
            board.write(f"p{i:03d}", rnd.randrange(300))  # ties
        unkept = set(range(P))  # partitions whose scores the engine has not kept as they are now
        for i in range(40):
            f = ("RANK()", "DENSE_RANK()")[i % 2]
            player = f"p{rnd.randrange(200):03d}"
            home = partition_for(player.encode(), P)
            unkept |= {board.write(f"p{rnd.randrange(220):03d}", rnd.randrange(300)) for _ in range(i % 3)}
            board.cluster.forget()
            assert board.answer(RANK.format(f=f), [player]) == board.expected(RANK.format(f=f), [player])
            assert board.asked() == sorted(unkept | {home})
            unkept &= {home}
        board.cluster.forget()
        assert board.answer(RANK.format(f="RANK()"), [player]) == board.expected(RANK.format(f="RANK()"), [player])
        assert len(board.cluster.requests()) == 1  # nothing moved: one call, to the player's partition
    finally:
        board.close()
