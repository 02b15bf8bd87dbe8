"""The leaderboard's in-memory order-statistics index, on real RocksDB shards, against a plain
sorted list of the rows written: after every batch of writes (updates, deletes, several to one
key in a batch) each query counts and picks what a sort of every row gives, for both score
directions and each tie order (and the row at each place, where the key breaks ties); a shard
opened again rebuilds the same index; and a global store's index of every partition holds what
its partitions' indexes hold, through writes, a reset and a reopen."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pyarrow.compute as pc
from hypothesis import given, settings
from hypothesis import strategies as st

from federator.catalog import StoreDefinition
from federator.store import ChangelogRecord, Shard
from federator.partitioner import partition_for
from federator_plugins.leaderboard.index import Order, key_order, nth, score_of, together
from federator_plugins.leaderboard.queries import AroundQuery, RankQuery, TopKQuery
from federator_plugins.leaderboard.store import AFTER, BEFORE, COUNT, SCORE, sortable_score
from tests.registry import REGISTRY

ORDERS = [(desc, tie) for desc in (True, False) for tie in (None, "asc", "desc")]


def board(key_format: str, partitions: int = 1) -> StoreDefinition:
    return StoreDefinition.from_dict({
        "name": "lb", "type": "leaderboard", "topic": "app-lb-changelog", "partitions": partitions,
        "key": {"name": "player", "format": key_format}, "value": {"name": "score", "format": "long"},
    }, REGISTRY)


def place(score: int, player, descending: bool, tie: str | None) -> tuple:
    """A row's place in the ranking order, as a sort of every row compares it."""
    first = -score if descending else score
    if tie is None:
        return (first,)
    return (first, player) if tie == "asc" else (first, _Reversed(player))


class _Reversed:
    def __init__(self, v) -> None:
        self.v = v

    def __lt__(self, other: "_Reversed") -> bool:
        return other.v < self.v

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Reversed) and other.v == self.v


def counts(shard: Shard, scores: list, keys: list, descending: bool, tie: str | None) -> list[int]:
    batch, _ = shard.query(RankQuery((), tuple(scores), tuple(keys) if tie else (), descending, tie))
    return batch.column(COUNT).drop_null().to_pylist()


def said(batch) -> dict:
    """What the partition said beside its rows (the rows whose key is null), column by column."""
    return batch.filter(pc.is_null(batch.column("player"))).to_pydict()


def rows(batch) -> set[tuple]:
    return set(zip(batch.column("player").to_pylist(), batch.column("score").to_pylist()))


def check(shard: Shard, truth: dict, probes: list[int]) -> None:
    items = sorted(truth.items(), key=lambda kv: (-kv[1], kv[0]))
    some = items[0][0] if items else ("x" if shard.definition.key_format == "string" else 0)  # a key to ask with
    for desc, tie in ORDERS:
        places = [(s, p) for p, s in truth.items()] + [(s, some) for s in probes]
        got = counts(shard, [s for s, _ in places], [p for _, p in places], desc, tie)
        want = [sum(1 for p2, s2 in truth.items() if place(s2, p2, desc, tie) < place(s, p, desc, tie))
                for s, p in places]
        assert got == want, (desc, tie)
    ranked = sorted(set(truth.values()))
    for desc in (True, False):
        best_first = ranked[::-1] if desc else ranked
        for k in (0, 1, 2, 5):
            batch, _ = shard.query(TopKQuery(k, desc))
            cut = sorted(truth.values(), reverse=desc)[k - 1] if 0 < k <= len(truth) else None
            want = {(p, s) for p, s in truth.items() if k > len(truth) or (cut is not None and (s >= cut if desc else s <= cut))}
            assert rows(batch) == want
            batch, _ = shard.query(TopKQuery(k, desc, distinct=True))
            assert rows(batch) == {(p, s) for p, s in truth.items() if s in best_first[:k]}
        for s in probes:
            batch, _ = shard.query(RankQuery((), (s,), (), desc, None, dense=True))
            better = [v for v in said(batch)[SCORE] if v is not None]
            assert sorted(better) == sorted(sortable_score(shard.definition, v) for v in ranked
                                            if (v > s if desc else v < s))
            for above, below in ((0, 0), (1, 2), (3, 1)):
                batch, _ = shard.query(AroundQuery(some, sortable_score(shard.definition, s),
                                                   above, below, desc))
                got = rows(batch) - {(None, None)}
                ahead = sorted((v for v in truth.values() if (v > s if desc else v < s)), reverse=not desc)
                behind = sorted((v for v in truth.values() if (v < s if desc else v > s)), reverse=desc)
                hi = ahead[above - 1] if 0 < above <= len(ahead) else (ahead[-1] if above and ahead else s)
                lo = behind[below - 1] if 0 < below <= len(behind) else (behind[-1] if below and behind else s)
                inside = (lambda v: lo <= v <= hi) if desc else (lambda v: hi <= v <= lo)
                assert got == {(p, v) for p, v in truth.items() if inside(v)}, (s, above, below, desc)
                meta = {k: v[0] for k, v in said(batch).items()}
                assert meta[BEFORE] == sum(1 for v in truth.values() if (v > max(hi, s) if desc else v < min(hi, s)))
                assert meta[AFTER] == sum(1 for v in truth.values() if (v < min(lo, s) if desc else v > max(lo, s)))
    if items:  # the player's own score, as the same read saw it
        batch, _ = shard.query(AroundQuery(items[0][0], 0, 0, 0, True))
        assert said(batch)[SCORE] == [sortable_score(shard.definition, items[0][1])]
    entries = shard._memory.entries
    for desc, tie in ORDERS:  # the row at each place, where the key breaks ties: a sort's k-th
        if tie is not None:
            want = sorted(entries, key=lambda e: place(score_of(e), e[8:], desc, tie))
            assert [entries[nth(entries, k, Order(desc, tie))] for k in range(len(entries))] == want, (desc, tie)


writes = st.lists(st.lists(st.tuples(st.integers(0, 9), st.one_of(st.none(), st.integers(-4, 4))),
                           min_size=1, max_size=8), min_size=1, max_size=5)


@settings(max_examples=25, deadline=None)
@given(batches=writes, key_format=st.sampled_from(["string", "long"]))
def test_the_index_answers_as_a_sort_of_every_row_does(batches, key_format) -> None:
    defn = board(key_format)
    name = (lambda i: f"p{i}") if key_format == "string" else (lambda i: i * 7 - 30)  # negative keys too
    with tempfile.TemporaryDirectory() as tmp:
        shard = Shard(Path(tmp) / "s", defn, 0)
        truth: dict = {}
        offset = 0
        for batch in batches:
            records = []
            for i, score in batch:
                records.append(ChangelogRecord(defn.key.serialize(name(i)), None if score is None
                                               else defn.value.serialize(score), offset, 1_700_000_000_000))
                offset += 1
                if score is None:
                    truth.pop(name(i), None)
                else:
                    truth[name(i)] = score
            shard.apply(records)
            check(shard, truth, [-5, 0, 3, 5])
        shard.close()
        reopened = Shard(Path(tmp) / "s", defn, 0)
        assert [score_of(e) for e in reopened._memory.entries] == sorted(
            sortable_score(defn, s) for s in truth.values())
        check(reopened, truth, [-5, 0, 5])
        reopened.close()


def test_key_order_sorts_signed_keys_as_numbers() -> None:
    defn = board("long")
    keys = [-(2**63), -5, -1, 0, 1, 2**40, 2**63 - 1]
    order = key_order("long")
    assert sorted(keys, key=lambda k: order(defn.key.serialize(k))) == keys
    assert all(order(order(defn.key.serialize(k))) == defn.key.serialize(k) for k in keys)


@settings(max_examples=25, deadline=None)
@given(batches=writes)
def test_a_global_stores_index_of_every_partition_holds_what_the_partitions_hold(batches) -> None:
    defn = board("string", partitions=3)
    with tempfile.TemporaryDirectory() as tmp:
        shards = [Shard(Path(tmp) / f"s{p}", defn, p) for p in range(3)]

        def write(batch: list, offset: int) -> None:
            for p, shard in enumerate(shards):
                records = [ChangelogRecord(k, None if score is None else defn.value.serialize(score), offset + n, 0)
                           for n, (i, score) in enumerate(batch)
                           if partition_for(k := defn.key.serialize(f"p{i}"), 3) == p]
                shard.apply(records, offset + len(batch))

        def holds_the_parts() -> list:
            index = together([s._memory for s in shards])
            assert list(index.entries) == sorted(e for s in shards for e in s._memory.entries)
            return index

        write(batches[0], 0)
        first = holds_the_parts()
        for n, batch in enumerate(batches[1:], 1):
            write(batch, 100 * n)
            assert holds_the_parts() is first  # fed by the parts' writes, not made again
        shards[1].reset()
        after_reset = holds_the_parts()
        assert after_reset is not first
        shards[2].close()
        shards[2] = Shard(Path(tmp) / "s2", defn, 2)
        write(batches[-1], 1000)
        assert holds_the_parts() is not after_reset
        for s in shards:
            s.close()
