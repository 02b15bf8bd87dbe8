"""A rule's later rounds read no partition at a state older than its earlier rounds did.

A partitioned leaderboard's rank reads the player's score from its partition, then counts the
better scores in every partition. The answer's position is the newest state each partition was
read at; were the counting round answered by a copy behind the first round (the partition's new
owner after a rebalance, still catching up), the rank would be an older state's while its
token names the newer one. Over a cluster in one process (tests/unit/memory_cluster.py) whose
leaderboard is held in real RocksDB shards."""

from __future__ import annotations

import pyarrow as pa

from federator.catalog import StoreDefinition
from federator.errors import SqlError
from federator.owner.duck import Duck, DuckConfig
from federator.partitioner import partition_for
from federator.query.position import Position
from federator.sql.result import SqlRequest
from federator.store import ChangelogRecord, Shard
from tests.registry import REGISTRY
from tests.unit.memory_cluster import MemoryCluster

P = 4
RANK = "SELECT player, score, RANK() OVER (ORDER BY score DESC) AS r FROM board QUALIFY player = ?"


def rows(result) -> list[tuple]:
    return [tuple(r.values()) for r in pa.Table.from_batches(list(result.batches), result.schema).to_pylist()]


def _same_partition() -> tuple[str, str, int]:
    players = [f"p{i:03d}" for i in range(100)]
    first = players[0]
    p = partition_for(first.encode(), P)
    second = next(x for x in players[1:] if partition_for(x.encode(), P) == p)
    return first, second, p


def test_a_ranks_counting_round_is_not_answered_by_a_copy_behind_its_first_round(tmp_path) -> None:
    defn = StoreDefinition.from_dict({
        "name": "board", "type": "leaderboard", "topic": "app-board-changelog", "partitions": P,
        "key": {"name": "player", "format": "string"}, "value": {"name": "score", "format": "long"}}, REGISTRY)
    cluster = MemoryCluster([defn], Duck(DuckConfig(memory_limit="256MB", spill_dir=tmp_path)), ("me",))
    me, rival, p = _same_partition()
    writes = [ChangelogRecord(k.encode(), defn.value.serialize(v), o, 1_700_000_000_000)
              for o, (k, v) in enumerate([(me, 100), (rival, 50), (rival, 150)])]
    current, behind = Shard(tmp_path / "current", defn, p), Shard(tmp_path / "behind", defn, p)
    current.apply(writes)  # the rival's 150 beats the player's 100: rank 2 at offset 2
    behind.apply(writes[:2])  # a copy that has not seen the rival's 150: rank 1 at offset 1
    shards = [current, behind] + [Shard(tmp_path / f"s{q}", defn, q) for q in range(P) if q != p]
    for q in range(P):
        shard = current if q == p else shards[2 + q - (q > p)]
        cluster.shards[("board", q)] = cluster.nodes["me"].materializer.shards[("board", q)] = shard
    try:
        engine = cluster.engine()
        engine.execute(SqlRequest(RANK, [rival]))  # planned (and that answer kept): the player's is rebound
        assert rows(engine.execute(SqlRequest(RANK, [me]))) == [(me, 100, 2)]

        gather = engine.dispatcher.gather
        rounds = []

        def owner_replaced_after_the_first_round(*args, **kwargs):
            if rounds:
                cluster.nodes["me"].materializer.shards[("board", p)] = behind
            rounds.append(args[4].bound)
            return gather(*args, **kwargs)

        engine.dispatcher.gather = owner_replaced_after_the_first_round  # type: ignore[method-assign]
        try:
            got = engine.execute(SqlRequest(RANK, [me], timeout_ms=300))
        except SqlError as e:  # no copy caught up with the first round in time: said, not answered wrong
            assert e.code in ("NOT_UP_TO_BOUND", "TIMEOUT", "UNAVAILABLE"), e
        else:
            at = Position.from_token(got.consistency_token).get(defn.topic, p)
            answer = rows(got)
            assert answer == [(me, 100, 2 if at == 2 else 1)], (answer, at)
        assert len(rounds) >= 2 and rounds[1].position is not None and rounds[1].position.get(defn.topic, p) == 2
    finally:
        for shard in shards:
            shard.close()
