"""Job answers, read back from the nodes with SQL, equal DuckDB's over the same input."""

from __future__ import annotations

import collections
import re

import duckdb
import pytest

from tests.spark.conftest import EVENTS, TEXT, rows, sql

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def events(world):
    db = duckdb.connect()
    db.execute("SET TimeZone = 'UTC'")
    db.execute(f"CREATE VIEW events AS SELECT * FROM read_parquet('{world.game_input}/*.parquet')")
    return db


def test_generated_events(events):
    n, players, games, lo, hi = events.execute(
        "SELECT count(*), count(DISTINCT player), count(DISTINCT game), min(score), max(score) FROM events").fetchone()
    assert (n, players, games) == (EVENTS, 50, 20)
    assert 0 <= lo and hi < 1000
    assert [str(t) for t in events.execute("SELECT typeof(player), typeof(score), typeof(ts) FROM events LIMIT 1")
            .fetchone()] == ["VARCHAR", "BIGINT", "TIMESTAMP WITH TIME ZONE"]


def test_player_stats(world, events):
    expected = events.execute("""
        SELECT player, count(DISTINCT game), sum(score)::BIGINT, max(score), epoch_ms(max(ts))
        FROM events GROUP BY player ORDER BY player""").fetchall()
    got = rows(sql(world.node, "SELECT player, games, total_score, best_score, last_seen FROM player_stats",
                   world.tokens["player_stats"]))
    assert got == [tuple(r) for r in expected]


def test_scores_per_minute(world, events):
    expected = events.execute("""
        SELECT player, epoch_ms(ts) // 60000 * 60000 AS ws, epoch_ms(ts) // 60000 * 60000 + 60000, sum(score)::BIGINT
        FROM events GROUP BY ALL ORDER BY ALL""").fetchall()
    got = rows(sql(world.node, "SELECT player, window_start, window_end, total_score FROM scores_per_minute",
                   world.tokens["scores_per_minute"]))
    assert got == [tuple(r) for r in expected]


def test_player_sessions(world, events):
    expected = events.execute("""
        WITH e AS (SELECT player, epoch_ms(ts) AS t FROM events),
        g AS (SELECT player, t, CASE WHEN t - lag(t) OVER (PARTITION BY player ORDER BY t) < 1800000
                                     THEN 0 ELSE 1 END AS new FROM e),
        s AS (SELECT player, t, sum(new) OVER (PARTITION BY player ORDER BY t ROWS UNBOUNDED PRECEDING) AS sid FROM g)
        SELECT player, min(t), max(t), count(*) FROM s GROUP BY player, sid ORDER BY ALL""").fetchall()
    got = rows(sql(world.node, "SELECT player, window_start, window_end, games FROM player_sessions",
                   world.tokens["player_sessions"]))
    assert got == [tuple(r) for r in expected]
    assert len(got) > 50 and any(g > 1 for *_, g in got)  # several sessions per player, some with several games


def test_a_leaderboard_query(world, events):
    expected = events.execute(
        "SELECT player, sum(score)::BIGINT AS s FROM events GROUP BY player ORDER BY s DESC, player LIMIT 5").fetchall()
    got = sql(world.node, "SELECT player, total_score FROM player_stats ORDER BY total_score DESC, player LIMIT 5",
              world.tokens["player_stats"])
    assert [tuple(r.values()) for r in got.to_pylist()] == [tuple(r) for r in expected]


def test_leaderboard_store_top_k_and_rank(world, events):
    """The leaderboard plugin's store, filled by the job: top-k and ranks equal DuckDB's."""
    events.execute("CREATE OR REPLACE TEMP TABLE leaderboard AS "
                   "SELECT player, sum(score)::BIGINT AS total_score FROM events GROUP BY player")
    token = world.tokens["leaderboard"]
    for text in ("SELECT player, total_score FROM leaderboard ORDER BY total_score DESC, player LIMIT 7",
                 "SELECT player, total_score, RANK() OVER (ORDER BY total_score DESC) AS r FROM leaderboard "
                 "QUALIFY player IN ('player_00003', 'player_00042') ORDER BY player"):
        got = sql(world.node, text, token)
        assert [tuple(r.values()) for r in got.to_pylist()] == [tuple(r) for r in events.execute(text).fetchall()]
    plan = sql(world.node, "EXPLAIN SELECT player FROM leaderboard ORDER BY total_score DESC LIMIT 3", token)
    assert all("TopKQuery" in q for q in plan.column("query").to_pylist())


def test_word_counts(world):
    expected = collections.Counter(re.findall(r"[^\W\d_]+", TEXT.lower()))
    got = rows(sql(world.node, "SELECT word, count FROM word_counts", world.tokens["word_counts"]))
    assert got == sorted(expected.items())
    assert dict(got)["the"] == 3 and "über" in dict(got) and "end" in dict(got) and "of" in dict(got)
