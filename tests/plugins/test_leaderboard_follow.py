"""A global leaderboard's top-k kept across writes: ``top_k_unchanged`` says the answer stayed
the same only when it did (compared with the top-k computed again after every write), and
says so for the writes that do not reach it."""

from __future__ import annotations

import random

import pytest

from federator.store.shard import read_together
from federator.store.together import unchanged_since
from federator_plugins.leaderboard.index import LOGGED_BATCHES, ScoreIndex, entry
from federator_plugins.leaderboard.queries import TopKQuery
from federator_plugins.leaderboard.store import top_k_together, top_k_unchanged
from tests.plugins.test_leaderboard_rank import Board


def answer(board: Board, q: TopKQuery) -> list[tuple]:
    return read_together(board.shards, lambda views: top_k_together(views, q))[0].rows


@pytest.mark.parametrize("q", [TopKQuery(5, True), TopKQuery(5, False), TopKQuery(3, True, True),
                               TopKQuery(400, True)], ids=["best 5", "worst 5", "3 best scores", "more than all"])
def test_a_top_k_is_said_unchanged_only_when_it_is(tmp_path, q) -> None:
    board = Board(tmp_path, "long", "global")
    rnd = random.Random(11)
    history: list[tuple[list[int], list[tuple]]] = []
    said = {True: 0, False: 0}
    try:
        for _ in range(80):
            history.append(([-1 if s.offset is None else s.offset for s in board.shards], answer(board, q)))
            player = f"p{rnd.randrange(320):03d}"  # some players new
            score = None if rnd.random() < 0.05 else rnd.randrange(-25, 45)
            board.write((player, score))
            now = answer(board, q)
            for offsets, then in history:
                same = unchanged_since(board.shards, q, offsets, top_k_unchanged)
                said[same] += 1
                assert not same or then == now, (offsets, then, now)
    finally:
        board.close()
    assert said[False] and (said[True] or q.k == 400), said  # every write joins a top-k of all rows


def test_the_index_remembers_what_each_batch_touched_back_to_what_it_forgot() -> None:
    index = ScoreIndex([entry(5, b"a"), entry(9, b"b")], offset=10)
    assert index.touched_since(10) == (None, None) and index.touched_since(9) is None
    index.change([entry(5, b"a")], [entry(7, b"a")], through=12)()
    index.change([], [entry(1, b"c")], through=13)()
    assert index.touched_since(10) == (entry(1, b"c"), entry(7, b"a"))
    assert index.touched_since(12) == (entry(1, b"c"), entry(1, b"c"))
    assert index.touched_since(13) == (None, None)
    for offset in range(14, 14 + LOGGED_BATCHES):
        index.change([], [entry(2, b"d%d" % offset)], through=offset)()
    assert index.touched_since(12) is None  # the batch through 13 is forgotten: so is what came after 12
    assert index.touched_since(13) is not None
