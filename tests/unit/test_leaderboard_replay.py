"""The leaderboard bench's check of answers as of their positions (tests/bench/leaderboard_replay.py):
the scores it holds at any position equal those recomputed from the log, and answers that do not
match their position are named wrong."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.bench.leaderboard_replay import Replay, check_all, rank_wrong, top_wrong, zrevrank_wrong

PLAYERS = ["ann", "bob", "cyd", "dee", "eve"]
TOTALS = [50, 40, 30, 20, 10]


def replay_with_writes() -> Replay:
    """Two partitions at offsets 4 and 9; then bob 45 at p0/5, eve 60 at p1/10, bob 70 at p0/6,
    recorded out of order (as two producers' acknowledgements may come)."""
    r = Replay(PLAYERS, TOTALS, {0: 4, 1: 9})
    r.record(1, 10, 4, 60)
    r.record(0, 6, 1, 70)
    r.record(0, 5, 1, 45)
    r.settle()
    return r


def test_scores_ranks_and_top_as_of_each_position_forward_and_back() -> None:
    r = replay_with_writes()
    assert r.last() == {0: 6, 1: 10}
    assert r.move_to({0: 6, 1: 10}) is None
    assert (r.score("bob"), r.better(70), r.top(3)) == (70, 0, [70, 60, 50])
    assert r.move_to({0: 5, 1: 9}) is None  # back: bob's 70 and eve's 60 undone
    assert (r.score("bob"), r.score("eve"), r.top(2)) == (45, 10, [50, 45])
    assert r.move_to({0: 4, 1: 10}) is None
    assert (r.score("bob"), r.score("eve"), r.better(40)) == (40, 60, 2)


def test_answers_are_checked_as_of_their_own_positions() -> None:
    r = replay_with_writes()
    answers = [({0: 6, 1: 10}, top_wrong([["bob", 70], ["eve", 60]], 2)),
               ({0: 4, 1: 9}, rank_wrong([["bob", 40, 2]])),
               ({0: 5, 1: 9}, rank_wrong([["bob", 45, 2]])),
               ({0: 6, 1: 9}, top_wrong([["bob", 70], ["ann", 50]], 2))]
    assert check_all(r, answers) == []
    wrong = check_all(r, [({0: 6, 1: 10}, rank_wrong([["bob", 45, 2]])),  # bob's score before his last game
                          ({0: 5, 1: 10}, rank_wrong([["ann", 50, 2]])),  # right: eve's 60 ahead of her
                          ({0: 4, 1: 9}, top_wrong([["ann", 50], ["cyd", 30]], 2)),  # bob's 40 left out
                          ({0: 4, 1: 9}, top_wrong([["bob", 40], ["ann", 50]], 2))])  # not best first
    assert len(wrong) == 3, wrong
    assert "as of the position [50, 40]" in " ".join(wrong)
    assert "rank: bob with 45, as of the position 70 (bob's last writes: 45 at offset 5, 70 at offset 6 of partition 0, " \
           "checked as of offset 6)" in wrong


def test_positions_outside_the_log_are_wrong() -> None:
    r = replay_with_writes()
    assert "older than" in r.move_to({0: 3, 1: 9})  # type: ignore[operator]
    assert "past the last write" in r.move_to({0: 7, 1: 9})  # type: ignore[operator]
    assert "names partitions [0]" in r.move_to({0: 5})  # type: ignore[operator]


def test_redis_ranks_may_fall_anywhere_among_ties() -> None:
    r = Replay(["a", "b", "c"], [5, 5, 9], {0: 0})
    assert check_all(r, [({0: 0}, zrevrank_wrong("a", 1, 5.0)), ({0: 0}, zrevrank_wrong("b", 2, 5.0))]) == []
    assert len(check_all(r, [({0: 0}, zrevrank_wrong("a", 0, 5.0)), ({0: 0}, zrevrank_wrong("c", 0, 8.0))])) == 2


@settings(max_examples=60, deadline=None)
@given(writes=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 30)), max_size=25),
       targets=st.lists(st.tuples(st.integers(0, 25), st.integers(0, 25)), min_size=1, max_size=8))
def test_the_state_at_any_position_is_the_log_replayed_from_the_base(writes, targets) -> None:
    players, totals = [f"p{i}" for i in range(6)], [3, 1, 4, 1, 5, 9]
    r = Replay(players, totals, {0: 0, 1: 0})
    logged = []
    for k, (player, score) in enumerate(writes):  # a player's partition: player % 2; offsets 1, 2, ... in each
        partition = player % 2
        offset = 1 + sum(1 for w in writes[:k] if w[0] % 2 == partition)
        logged.append((partition, offset, player, score))
        r.record(partition, offset, player, score)
    r.settle()
    last = r.last()
    for t0, t1 in targets:
        at = {0: min(t0, last[0]), 1: min(t1, last[1])}
        assert r.move_to(at) is None
        want = list(totals)
        for partition, offset, player, score in logged:
            if offset <= at[partition]:
                want[player] = score
        assert r.scores == want
        assert r.top(3) == sorted(want, reverse=True)[:3]
        assert all(r.better(s) == sum(1 for x in want if x > s) for s in want)
