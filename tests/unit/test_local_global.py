"""What the SQL engine answers at once over global stores (``SqlEngine.local_global``, part of
``answer_now``, for the HTTP server's event loop): a global leaderboard's ranks and top, read
from every partition in one read on the node asked, equal to what ``execute`` answers; anything
that could wait, or is large, is left to ``execute``.

Over a cluster in one process (tests/unit/memory_cluster.py) whose global leaderboard is held in
real RocksDB shards, as a node keeps them (the leaderboard's index lives beside them)."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Iterator

import duckdb
import pyarrow as pa
import pytest

from federator.catalog import StoreDefinition
from federator.owner.duck import Duck, DuckConfig
from federator.partitioner import partition_for
from federator.query.position import Position
from federator.sql.result import SqlRequest, SqlResult
from federator.store import ChangelogRecord, Shard
from tests.registry import REGISTRY
from tests.unit.memory_cluster import MemoryCluster

P = 4
PLAYERS = [f"p{i:03d}" for i in range(200)]
RANK = "SELECT player, score, RANK() OVER (ORDER BY score DESC) AS r FROM board QUALIFY player = ?"
TOP = "SELECT player, score FROM board ORDER BY score DESC LIMIT 5"


def _board(name: str, is_global: bool) -> StoreDefinition:
    return StoreDefinition.from_dict({
        "name": name, "type": "leaderboard", "topic": f"app-{name}-changelog", "partitions": P,
        "key": {"name": "player", "format": "string"}, "value": {"name": "score", "format": "long"},
        "global": is_global}, REGISTRY)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[MemoryCluster]:
    yield from _cluster(tmp_path_factory.mktemp("at-once"))


def _cluster(root) -> Iterator[MemoryCluster]:
    """One node: the global ``board`` (scores with ties) in RocksDB shards, and ``local``, the
    same type partitioned."""
    board, local = _board("board", True), _board("local", False)
    c = MemoryCluster([board, local], Duck(DuckConfig(memory_limit="256MB", spill_dir=root)), ("me",))
    shards = [Shard(root / f"s{p}", board, p) for p in range(P)]
    rnd = random.Random(3)
    records: dict[int, list[ChangelogRecord]] = {}
    for player in PLAYERS:
        kb = player.encode()
        p = partition_for(kb, P)
        part = records.setdefault(p, [])
        part.append(ChangelogRecord(kb, board.value.serialize(rnd.randrange(50)), len(part), 1_700_000_000_000))
    for p, shard in enumerate(shards):
        shard.apply(records[p])
        c.shards[("board", p)] = c.nodes["me"].materializer.shards[("board", p)] = shard
    yield c
    for shard in shards:
        shard.close()


def rows(result: SqlResult) -> list[dict]:
    return pa.Table.from_batches(list(result.batches), result.schema).to_pylist()


def without_time(stats: dict) -> dict:
    return {k: v for k, v in stats.items() if k != "elapsed_ms"}


# a statement kept whole (its answer is kept), and one whose text's plan is rebound to each player
KEPT_AND_REBOUND = [(TOP, []), (RANK, ["p007"])]


def test_a_global_leaderboards_rank_and_top_are_answered_at_once_as_execute_answers_them(cluster) -> None:
    engine = cluster.engine()
    assert engine.local_global(SqlRequest(RANK, ["p001"])) is None  # a new text is planned by execute first
    engine.execute(SqlRequest(RANK, ["p001"]))
    for player in ("p007", "p150", "nobody"):  # the text's plan rebound to each: read straight from the copies
        now, then = engine.local_global(SqlRequest(RANK, [player])), engine.execute(SqlRequest(RANK, [player]))
        assert now is not None and rows(now) == rows(then) and now.schema == then.schema
        assert now.consistency_token == then.consistency_token
        assert without_time(now.stats) == without_time(then.stats)
    engine.execute(SqlRequest(TOP))
    now = engine.local_global(SqlRequest(TOP))
    assert now is not None
    top = rows(now)
    assert top == rows(engine.execute(SqlRequest(TOP))) and len(top) == 5


def test_a_rank_answered_at_once_is_counted_as_the_stores_query_as_execute_counts_it(cluster) -> None:
    engine, node = cluster.engine(), cluster.nodes["me"]
    engine.execute(SqlRequest(RANK, ["p001"]))

    def ranks_read() -> dict:
        return node.meter.stats()["board"]["PlayerRanksQuery"]

    before = ranks_read()
    assert engine.local_global(SqlRequest(RANK, ["p007"])) is not None
    at_once = ranks_read()
    engine.execute(SqlRequest(RANK, ["p150"]))
    executed = ranks_read()
    # one read of every partition, with the one row it found, each way
    assert at_once["queries"] - before["queries"] == executed["queries"] - at_once["queries"] == 1
    assert at_once["rows"] - before["rows"] == executed["rows"] - at_once["rows"] == 1


@pytest.mark.parametrize("sql, params, options", [
    (RANK, ["p007"], {"consistency_token": "e30"}),  # a token may have to be waited for
    (RANK.replace("board", "local"), ["p007"], {}),  # a partitioned store: its owners are asked
    ("SELECT player, score FROM board ORDER BY score DESC", [], {}),  # every row
    ("SELECT COUNT(*) AS n FROM board", [], {}),  # every row, then DuckDB
    ("EXPLAIN " + TOP, [], {}),
])
def test_what_could_wait_or_is_large_is_left_to_execute(cluster, sql, params, options) -> None:
    engine = cluster.engine()
    engine.execute(SqlRequest(sql, params))  # planned
    assert engine.local_global(SqlRequest(sql, params, **options)) is None


@pytest.mark.parametrize("sql, params", KEPT_AND_REBOUND)
def test_a_copy_behind_the_lag_a_stale_read_allows_is_left_to_execute(cluster, monkeypatch, sql, params) -> None:
    engine = cluster.engine()
    engine.execute(SqlRequest(sql, ["p001"] if params else []))
    assert engine.local_global(SqlRequest(sql, params, allow_stale=True, max_lag=3)) is not None
    monkeypatch.setattr(cluster.nodes["me"], "local_lag", lambda store, p: 5 if p == 2 else 0)
    assert engine.local_global(SqlRequest(sql, params, allow_stale=True, max_lag=3)) is None
    assert engine.local_global(SqlRequest(sql, params, allow_stale=True, max_lag=5)) is not None


@pytest.mark.parametrize("sql, params", KEPT_AND_REBOUND)
def test_a_copy_still_restoring_is_left_to_execute(cluster, monkeypatch, sql, params) -> None:
    """execute waits for it (or says why it cannot answer); the event loop must not."""
    engine = cluster.engine()
    engine.execute(SqlRequest(sql, ["p001"] if params else []))
    materializer = cluster.nodes["me"].materializer
    hosted = materializer.hosted
    monkeypatch.setattr(materializer, "hosted", lambda store, p: replace(hosted(store, p), caught_up=p != 2))
    monkeypatch.setattr(materializer, "epoch", materializer.epoch + 1)  # as a copy no longer current moves it
    assert engine.local_global(SqlRequest(sql, params)) is None
    assert engine.local_global(SqlRequest(sql, params, allow_stale=True)) is None


def test_copies_current_again_answer_before_the_materializer_counts_the_change(cluster, monkeypatch) -> None:
    """Whether every copy may answer is kept until the materializer's epoch moves; a copy that
    became current in the moment before it moves is read, not refused."""
    engine = cluster.engine()
    engine.execute(SqlRequest(TOP))
    materializer = cluster.nodes["me"].materializer
    hosted = materializer.hosted
    with monkeypatch.context() as m:
        m.setattr(materializer, "hosted", lambda store, p: replace(hosted(store, p), caught_up=p != 2))
        m.setattr(materializer, "epoch", materializer.epoch + 1)
        assert engine.local_global(SqlRequest(TOP)) is None
        m.setattr(materializer, "hosted", hosted)  # current again, the epoch not yet moved
        now = engine.local_global(SqlRequest(TOP))
        assert now is not None and rows(now) == rows(engine.execute(SqlRequest(TOP)))


def test_a_statement_never_planned_is_left_to_execute_even_when_it_is_no_sql(cluster) -> None:
    """execute says what is wrong with it (and counts it); answer_now neither parses nor raises."""
    engine = cluster.engine()
    assert engine.answer_now(SqlRequest("SELEC player FROM board")) is None
    assert engine.answer_now(SqlRequest(TOP.replace("LIMIT 5", "LIMIT 6"))) is None  # a text not planned yet


AROUND = ("WITH me AS (SELECT RANK() OVER (ORDER BY score DESC) AS r FROM board QUALIFY player = ?) "
          "SELECT player, score, RANK() OVER (ORDER BY score DESC) AS r FROM board "
          "QUALIFY r BETWEEN (SELECT r FROM me) - 3 AND (SELECT r FROM me) + 3 ORDER BY r, player")


@pytest.mark.parametrize("sql, params", [
    (RANK, ["p007"]), (RANK, ["nobody"]), (TOP.replace("DESC", "DESC, player"), []), (AROUND, ["p150"]),
    (AROUND, ["nobody"]),
])
def test_a_global_leaderboards_few_rows_stay_python_values_and_equal_duckdbs(cluster, sql, params) -> None:
    """No Arrow on the way from the score index to a JSON answer (``rows``), and the same rows
    as DuckDB ranks over the store's rows."""
    engine = cluster.engine()
    got = engine.execute(SqlRequest(sql, params))
    assert got.rows is not None, sql
    whole = pa.Table.from_batches(list(engine.execute(SqlRequest("SELECT player, score FROM board")).batches))
    db = duckdb.connect()
    db.register("board", whole)
    want = db.execute(sql, params).fetchall()
    assert got.rows == want
    assert [tuple(r.values()) for r in rows(got)] == want  # and the same when a format asks for Arrow


def test_a_kept_top_follows_the_writes_that_do_not_reach_it(tmp_path) -> None:
    """A new score below the top-5's worst leaves the kept top-5 the answer, now at the new
    positions (its token says so); one that reaches it does not."""
    gen = _cluster(tmp_path)
    cluster = next(gen)
    engine = cluster.engine()
    board = cluster.nodes["me"].stores["board"]

    def write(player: str, score: int) -> tuple[int, int]:
        """(the partition written, its offset now)"""
        kb = player.encode()
        p = partition_for(kb, P)
        shard = cluster.shards[("board", p)]
        shard.apply([ChangelogRecord(kb, board.value.serialize(score), shard.offset + 1, 1_700_000_000_000)])
        return p, shard.offset

    top = TOP.replace("DESC", "DESC, player")  # ties broken: one answer

    def truth() -> list[dict]:
        whole = pa.Table.from_batches(list(engine.execute(SqlRequest("SELECT player, score FROM board")).batches))
        db = duckdb.connect()
        db.register("board", whole)
        return db.sql(top).to_arrow_table().to_pylist()

    try:
        engine.execute(SqlRequest(top))
        p, offset = write("p050", -1)  # below every score
        followed = engine.local_kept(SqlRequest(top))
        assert followed is not None and followed.stats.get("answer_followed_writes"), followed
        assert rows(followed) == truth()
        assert Position.from_token(followed.consistency_token).get(board.topic, p) == offset
        materializer = cluster.nodes["me"].materializer
        materializer.epoch += 1  # a copy reset or handed over: offsets name other states
        write("p052", -2)
        assert engine.local_kept(SqlRequest(top)) is None
        assert rows(engine.execute(SqlRequest(top))) == truth()
        write("p053", -3)
        assert engine.local_kept(SqlRequest(top)).stats.get("answer_followed_writes")  # from the new epoch on
        write("p051", 1_000)  # the new best
        assert engine.local_kept(SqlRequest(top)) is None
        fresh = engine.execute(SqlRequest(top))
        got = rows(fresh)
        assert not fresh.stats.get("answer_reused") and got[0] == {"player": "p051", "score": 1_000}
        assert got == truth()
    finally:
        gen.close()


def test_the_players_around_one_on_a_global_leaderboard_are_answered_at_once(cluster) -> None:
    engine = cluster.engine()
    engine.execute(SqlRequest(AROUND, ["p150"]))  # planned
    for player in ("p007", "p150", "nobody"):
        now, then = engine.local_global(SqlRequest(AROUND, [player])), engine.execute(SqlRequest(AROUND, [player]))
        assert now is not None and rows(now) == rows(then), player
