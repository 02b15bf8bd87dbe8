"""The leaderboard's rank rule over real RocksDB shards, with a stand-in for the receiver's
fetch: ranked from every partition's whole index where answers are kept, by RankQuery where
they are not or a partition is too large, the same ranks either way; and planned once for a
statement's text, rebound for each player."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from federator.catalog import StoreDefinition
from federator.partitioner import partition_for
from federator.sql.parse import parse
from federator.sql.planner import bind_parameters, literal
from federator.store import ChangelogRecord, Shard
from federator_plugins.leaderboard import rules
from federator_plugins.leaderboard.rules import RANK_COLUMN, RankRule
from tests.registry import REGISTRY

P = 3


class Fetch:
    """The engine's fetch, over shards in this process; ``asked`` names each query type asked."""

    def __init__(self, shards: list[Shard], keeps: bool) -> None:
        self.shards, self.keeps, self.asked = shards, keeps, []
        self.refreshed_rows = 0
        self._kept: dict[tuple, pa.RecordBatch] = {}  # as the receiver keeps answers

    def __call__(self, subqueries, keep: bool = False) -> list[pa.RecordBatch]:
        out = []
        self.refreshed_rows = 0
        for sq in subqueries:
            self.asked.append(sq.query.type_name)
            for p in sq.partitions if sq.partitions is not None else range(P):
                batch, _ = self.shards[p].query(sq.query)  # the same batch while the shard is unchanged
                if keep and self.keeps:
                    old = self._kept.get((sq.query, p))
                    if old is not None and old is not batch:
                        self.refreshed_rows += batch.num_rows
                    self._kept[(sq.query, p)] = batch
                out.append(batch)
        return out


@pytest.fixture
def board(tmp_path, request) -> tuple[StoreDefinition, list[Shard], dict[str, float]]:
    fmt = getattr(request, "param", "long")
    defn = StoreDefinition.from_dict({
        "name": "lb", "type": "leaderboard", "topic": "app-lb-changelog", "partitions": P,
        "key": {"name": "player", "format": "string"}, "value": {"name": "score", "format": fmt}}, REGISTRY)
    shards = [Shard(tmp_path / f"s{p}", defn, p) for p in range(P)]
    rnd = random.Random(5)
    scores: dict[str, float] = {}
    for i in range(300):
        score = rnd.randrange(-20, 40)  # many ties
        scores[f"p{i:03d}"] = float(score) if fmt == "double" else score
    scores["p000"] = -0.0 if fmt == "double" else 0
    by_partition: dict[int, list] = {}
    for i, (player, score) in enumerate(scores.items()):
        by_partition.setdefault(partition_for(player.encode(), P), []).append(
            ChangelogRecord(player.encode(), defn.value.serialize(score), i, 1_700_000_000_000 + i))
    for p, records in by_partition.items():
        shards[p].apply(records)
    yield defn, shards, scores
    for s in shards:
        s.close()


def expected(scores: dict[str, float], players: list[str], descending: bool) -> list[tuple]:
    out = []
    for player in players:
        if player in scores:
            s = scores[player]
            better = sum(1 for v in scores.values() if (v > s if descending else v < s))
            out.append((player, s, better + 1))
    return out


def ranked(table: pa.Table) -> list[tuple]:
    return list(zip(table.column("player").to_pylist(), table.column("score").to_pylist(),
                    table.column(RANK_COLUMN).to_pylist()))


def plan_for(defn: StoreDefinition, text: str, params: list):
    stmt = parse(text)
    return RankRule().plan(bind_parameters(stmt.select, params, stmt.param_count), defn)


@pytest.mark.parametrize("board", ["long", "double"], indirect=True)
@pytest.mark.parametrize("direction", ["DESC", "ASC"])
@pytest.mark.parametrize("merged", [True, False])  # the scores in one array, or searched per partition
def test_ranks_from_kept_indexes_equal_ranks_from_rank_queries(board, direction, merged, monkeypatch) -> None:
    defn, shards, scores = board
    monkeypatch.setattr(rules, "MERGED_SCORES", 200_000 if merged else 100)
    players = ["p000", "p017", "p150", "nobody", "p299", "p017"]
    text = (f"SELECT player, score, RANK() OVER (ORDER BY score {direction}) AS r FROM lb "
            f"QUALIFY player IN ({', '.join('?' for _ in players)})")
    plan = plan_for(defn, text, players)
    kept, asked = Fetch(shards, keeps=True), Fetch(shards, keeps=False)
    want = expected(scores, list(dict.fromkeys(players)), direction == "DESC")
    assert ranked(plan.combine(kept)) == want and kept.asked == ["ScoreIndexQuery"]
    assert sorted(ranked(plan.combine(asked))) == sorted(want) and asked.asked == ["KeysQuery", "RankQuery"]
    assert plan.combine(kept).schema == plan.combine(asked).schema


def test_a_partition_too_large_to_hold_is_ranked_by_rank_queries(board, monkeypatch) -> None:
    defn, shards, scores = board
    monkeypatch.setattr(rules, "INDEX_ROWS", 50)  # every partition has about 100 rows
    rule = RankRule()
    stmt = parse("SELECT player, score, RANK() OVER (ORDER BY score DESC) AS r FROM lb QUALIFY player = ?")
    fetch = Fetch(shards, keeps=True)
    plan = rule.plan(bind_parameters(stmt.select, ["p042"], 1), defn)
    assert ranked(plan.combine(fetch)) == expected(scores, ["p042"], True)
    assert fetch.asked == ["ScoreIndexQuery", "KeysQuery", "RankQuery"]
    fetch.asked.clear()  # the store is known to be too large for a while: no index asked
    assert ranked(plan.combine(fetch)) == expected(scores, ["p042"], True) and fetch.asked == ["KeysQuery", "RankQuery"]


def test_indexes_read_again_and_again_give_way_to_rank_queries(board, monkeypatch) -> None:
    """Under writes to large partitions every rank would read indexes again whole: once the
    rows read again per rank average more than two rounds of calls cost, the store is ranked
    by RankQuery for a while. Ranks over unchanged partitions read nothing again."""
    defn, shards, scores = board
    monkeypatch.setattr(rules, "REREAD_ROWS", 3)  # every partition has about 100 rows, averaged over ~50 ranks
    stmt = parse("SELECT player, score, RANK() OVER (ORDER BY score DESC) AS r FROM lb QUALIFY player = ?")
    plan = RankRule().plan(bind_parameters(stmt.select, ["p042"], 1), defn)
    fetch = Fetch(shards, keeps=True)
    p = partition_for(b"p007", P)

    def write(i: int) -> None:
        shards[p].apply([ChangelogRecord(b"p007", defn.value.serialize(i), 20_000 + i, 1_700_000_000_000)])
        scores["p007"] = i

    for _ in range(5):  # unchanged: nothing read again
        assert ranked(plan.combine(fetch)) == expected(scores, ["p042"], True)
    assert set(fetch.asked) == {"ScoreIndexQuery"}
    fetch.asked.clear()
    for i in range(3):  # a write before each rank: that partition's index is read again
        write(i)
        assert ranked(plan.combine(fetch)) == expected(scores, ["p042"], True)
    assert fetch.asked == ["ScoreIndexQuery", "ScoreIndexQuery", "KeysQuery", "RankQuery"]


def test_a_plan_rebound_to_another_player_ranks_that_player(board) -> None:
    defn, shards, scores = board
    plan = plan_for(defn, "SELECT player, score, RANK() OVER (ORDER BY score DESC) AS r FROM lb "
                          "QUALIFY player = ? OR player = 'x'", ["p001"])
    assert plan is None  # not a shape the rule answers
    plan = plan_for(defn, "SELECT player, RANK() OVER (ORDER BY score DESC) AS r FROM lb "
                          "QUALIFY player IN (?, 'p007', ?)", ["p001", "p002"])
    rebound = plan.rebind([literal("p100", 0), literal("p200", 1)])
    fetch = Fetch(shards, keeps=True)
    assert ranked(rebound.combine(fetch)) == expected(scores, ["p100", "p007", "p200"], True)
    assert rebound.subqueries[1].query.keys == ("p100", "p007", "p200")


def test_what_a_rank_made_of_an_index_goes_with_it(board) -> None:
    """The key maps and merged scores made of the partitions' indexes live as long as the
    index batches do (the receiver's kept answers hold those): writes do not pile them up."""
    defn, shards, scores = board
    rule = RankRule()
    stmt = parse("SELECT player, score, RANK() OVER (ORDER BY score DESC) AS r FROM lb QUALIFY player = ?")
    plan = rule.plan(bind_parameters(stmt.select, ["p042"], 1), defn)
    fetch = Fetch(shards, keeps=True)
    plan.combine(fetch)
    made = len(rule._made)  # the key maps of the partitions looked in, and the scores merged
    assert made >= 2
    for i in range(5):  # each write makes the partition's index again
        p = partition_for(b"p042", P)
        shards[p].apply([ChangelogRecord(b"p042", defn.value.serialize(100 + i), 10_000 + i, 1_700_000_000_000)])
        scores["p042"] = 100 + i
        assert ranked(plan.combine(fetch)) == expected(scores, ["p042"], True)
    assert len(rule._made) == made
