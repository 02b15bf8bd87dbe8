"""The leaderboard store type on real RocksDB: the score index follows every write, top-k and ranks."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from federator.catalog import StoreDefinition
from federator.catalog.definition import DefinitionError
from federator.query import KeyQuery, RangeQuery
from federator.store import ChangelogRecord, Shard
from federator_plugins.leaderboard.queries import RankQuery, TopKQuery
from federator_plugins.leaderboard.store import COUNT, INDEX, sortable
from tests.registry import REGISTRY


def board(fmt: str = "long") -> StoreDefinition:
    return StoreDefinition.from_dict({
        "name": "lb", "type": "leaderboard", "topic": "app-lb-changelog", "partitions": 1,
        "key": {"name": "player", "format": "string"}, "value": {"name": "score", "format": fmt},
    }, REGISTRY)


def write(shard: Shard, changes: list[tuple[str, float | None]], offset: int = 0) -> int:
    fmt = shard.definition.value
    records = [
        ChangelogRecord(p.encode(), None if s is None else fmt.serialize(s), offset + i, 1_700_000_000_000 + i)
        for i, (p, s) in enumerate(changes)
    ]
    shard.apply(records)
    return offset + len(records)


def top(shard: Shard, k: int, descending: bool = True) -> list[tuple[str, float]]:
    batch, _ = shard.query(TopKQuery(k, descending))
    return list(zip(batch.column("player").to_pylist(), batch.column("score").to_pylist()))


def better(shard: Shard, scores: list, descending: bool = True) -> list[int]:
    batch, _ = shard.query(RankQuery(scores=tuple(scores), descending=descending))
    return batch.column(COUNT).drop_null().to_pylist()


def test_index_follows_updates_and_deletes_in_one_batch(tmp_path) -> None:
    shard = Shard(tmp_path / "s", board(), 0)
    n = write(shard, [("a", 10), ("b", 30), ("c", 20), ("a", 40), ("c", None), ("d", -5)])
    assert top(shard, 10) == [("a", 40), ("b", 30), ("d", -5)]
    n = write(shard, [("b", 1), ("e", 30)], n)
    assert top(shard, 2) == [("a", 40), ("e", 30)]
    assert top(shard, 2, descending=False) == [("d", -5), ("b", 1)]
    # the index holds exactly one entry per live key
    view = shard._view()
    assert sorted(k[8:] for k, _ in view.scan(family=INDEX)) == [b"a", b"b", b"d", b"e"]
    batch, _ = shard.query(KeyQuery("e"))
    assert batch.column("score").to_pylist() == [30]
    batch, _ = shard.query(RangeQuery("b", "d"))
    assert batch.column("player").to_pylist() == ["b", "d"]


def test_top_k_keeps_ties_with_the_last_row(tmp_path) -> None:
    shard = Shard(tmp_path / "s", board(), 0)
    write(shard, [("a", 5), ("b", 7), ("c", 7), ("d", 7), ("e", 1)])
    assert sorted(top(shard, 2)) == [("b", 7), ("c", 7), ("d", 7)]
    assert top(shard, 0) == []


def test_rank_counts_strictly_better_scores(tmp_path) -> None:
    shard = Shard(tmp_path / "s", board("double"), 0)
    write(shard, [("a", 1.5), ("b", -2.0), ("c", 9.0), ("d", 9.0), ("e", 0.0)])
    assert better(shard, [9.0, 1.5, -2.0, 100.0, -0.0]) == [0, 2, 4, 0, 3]
    assert better(shard, [9.0, 1.5, -2.0], descending=False) == [3, 2, 0]


def test_reset_empties_the_index_with_the_data(tmp_path) -> None:
    shard = Shard(tmp_path / "s", board(), 0)
    write(shard, [("a", 1), ("b", 2)])
    shard.reset()
    assert top(shard, 5) == []
    shard.close()
    reopened = Shard(tmp_path / "s", board(), 0)
    assert top(reopened, 5) == [] and reopened.offset is None


def test_reopened_shard_keeps_its_index(tmp_path) -> None:
    shard = Shard(tmp_path / "s", board(), 0)
    write(shard, [("a", 1), ("b", 2)])
    shard.close()
    assert top(Shard(tmp_path / "s", board(), 0), 5) == [("b", 2), ("a", 1)]


def test_a_leaderboard_needs_a_numeric_score() -> None:
    with pytest.raises(DefinitionError, match="value.format' must be one of long, int, double"):
        StoreDefinition.from_dict({
            "name": "lb", "type": "leaderboard", "topic": "t", "partitions": 1,
            "key": {"format": "string"}, "value": {"format": "string"},
        }, REGISTRY)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False, width=64), min_size=2, max_size=40))
def test_sortable_doubles_sort_like_numbers(values) -> None:
    assert sorted(values, key=lambda v: sortable("double", v)) == sorted(values)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), min_size=2, max_size=40))
def test_sortable_longs_sort_like_numbers(values) -> None:
    assert sorted(values, key=lambda v: sortable("long", v)) == sorted(values)


def test_random_writes_match_a_dict(tmp_path) -> None:
    rnd = random.Random(7)
    shard = Shard(tmp_path / "s", board(), 0)
    truth: dict[str, int] = {}
    offset = 0
    for _ in range(30):
        batch = []
        for _ in range(rnd.randrange(1, 20)):
            p = f"p{rnd.randrange(25)}"
            s = None if rnd.random() < 0.2 else rnd.randrange(-50, 50)
            batch.append((p, s))
            if s is None:
                truth.pop(p, None)
            else:
                truth[p] = s
        offset = write(shard, batch, offset)
        # ranks follow every write (the sorted scores a rank searches are kept until the next)
        probes = sorted(set(truth.values()) | {-51, 0, 51})
        assert better(shard, probes) == [sum(1 for v in truth.values() if v > s) for s in probes]
        assert better(shard, probes, descending=False) == [sum(1 for v in truth.values() if v < s) for s in probes]
    expected = sorted(truth.items(), key=lambda kv: -kv[1])
    got = top(shard, len(truth))
    assert sorted(got, key=lambda kv: (-kv[1], kv[0])) == sorted(expected, key=lambda kv: (-kv[1], kv[0]))
    for p, s in truth.items():
        assert better(shard, [s]) == [sum(1 for v in truth.values() if v > s)]
