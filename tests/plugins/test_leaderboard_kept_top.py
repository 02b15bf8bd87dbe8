"""A partitioned leaderboard's top-k asked again after writes: each partition's top k is kept
beside its state, so the engine reads again only the partitions the writes moved, and every
answer is still DuckDB's over the scores as written.

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


def test_a_partitioned_top_k_reads_again_only_the_partitions_writes_moved(tmp_path) -> None:
    board = StoreDefinition.from_dict({
        "name": "board", "type": "leaderboard", "topic": "app-board-changelog", "partitions": P,
        "key": {"name": "player", "format": "string"}, "value": {"name": "score", "format": "long"}}, REGISTRY)
    cluster = MemoryCluster([board], Duck(DuckConfig(memory_limit="256MB", spill_dir=tmp_path)), ("me",))
    shards = [Shard(tmp_path / f"s{p}", board, p) for p in range(P)]
    for p, shard in enumerate(shards):
        cluster.shards[("board", p)] = cluster.nodes["me"].materializer.shards[("board", p)] = shard
    scores: dict[str, int] = {}
    offsets = [0] * P
    rnd = random.Random(7)

    def write(player: str, score: int) -> int:
        kb = player.encode()
        p = partition_for(kb, P)
        shards[p].apply([ChangelogRecord(kb, board.value.serialize(score), offsets[p], 1_700_000_000_000)])
        offsets[p] += 1
        scores[player] = score
        return p

    def expected() -> list[tuple]:
        table = pa.table({"player": list(scores), "score": pa.array(list(scores.values()), pa.int64())})
        return duckdb.connect().register("board", table).execute(TOP).fetchall()

    def asked() -> list[int]:
        return sorted(p for r in cluster.requests() for p in r.partitions or range(P))

    engine = cluster.engine()
    try:
        for i in range(200):
            write(f"p{i:03d}", rnd.randrange(1_000))
        got = engine.execute(SqlRequest(TOP, []))
        assert [tuple(r.values()) for r in pa.Table.from_batches(list(got.batches)).to_pylist()] == expected()
        assert asked() == list(range(P))
        for _ in range(30):
            cluster.forget()
            moved = write(f"p{rnd.randrange(260):03d}", rnd.randrange(1_100))  # some players new, some past the top
            got = engine.execute(SqlRequest(TOP, []))
            assert [tuple(r.values()) for r in pa.Table.from_batches(list(got.batches)).to_pylist()] == expected()
            assert asked() == [moved]  # the other partitions' top 5 given again
    finally:
        cluster.close()
        for shard in shards:
            shard.close()
