"""Counts and sums an owner keeps beside its scans follow later writes exactly: for any
sequence of upserts and deletes over real shards, the owner's answer equals DuckDB's
statement over the shards' rows read again, and it came from the changed rows alone."""

from __future__ import annotations

import json
from decimal import Decimal

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from federator.catalog import StoreDefinition
from federator.owner.duck import Duck
from federator.owner.maintained import maintained
from federator.owner.work import followed_answer, owners_sql
from federator.query.position import Position, PositionBound
from federator.partitioner import partition_for
from federator.query.queries import RangeQuery
from federator.store.record import ChangelogRecord
from federator.store.layer import UNBOUNDED
from federator.store.scan_cache import CachingLayer, ScanCache
from federator.store.shard import Shard
from tests.registry import REGISTRY

P = 2
DUCK = Duck()
FOLLOWED = [  # what the planner sends owners (pushdown.partial_aggregate), for statements it follows
    'SELECT COUNT(*) AS "__a0" FROM rows',
    'SELECT SUM("a") AS "__a0", COUNT("a") AS "__a1", COUNT(*) AS "__a2" FROM rows',
    'SELECT "g" AS "__g0", COUNT(*) AS "__a0", SUM("a") AS "__a1" FROM rows GROUP BY "g"',
    'SELECT "g" AS "__g0", "key" AS "__g1", SUM("a") AS "__a0" FROM rows GROUP BY "g", "key"',
    # a MIN/MAX follows until its extreme is taken away: the test only checks the answers
    'SELECT "g" AS "__g0", MIN("a") AS "__a0", MAX("a") AS "__a1", MAX("key") AS "__a2", COUNT(*) AS "__a3" '
    'FROM rows GROUP BY "g"',
    'SELECT MIN("key") AS "__a0", MAX("a") AS "__a1" FROM rows',
]


def _definition() -> StoreDefinition:
    return StoreDefinition.from_dict({"name": "s", "type": "kv", "topic": "t", "partitions": P,
                                      "key": {"format": "string"},
                                      "value": {"format": "json", "fields": [{"name": "a", "type": "long"},
                                                                             {"name": "g", "type": "string"}]}},
                                     REGISTRY)


def _owner_answer(stores: list[CachingLayer], cache: ScanCache, sql: str) -> pa.RecordBatch:
    results = [s.run(RangeQuery()) for s in stores]  # as a node does: each partition's scan, then the SQL
    assert all(r.ok for r in results)
    owners_sql(DUCK, sql, [(r, s.base) for r, s in zip(results, stores)], cache)
    assert all(r.ok for r in results), results[0].message
    return results[0].batch


def _node_answer(stores: list[CachingLayer], cache: ScanCache, sql: str) -> pa.RecordBatch:
    """As a node answers: from the kept result and the rows written since, else over the scans."""
    got = followed_answer(sql, list(enumerate(stores)), UNBOUNDED, cache)
    if got is None:
        return _owner_answer(stores, cache, sql)
    assert [r.position for r in got] == [s.position for s in stores]  # each as of its changed rows
    return got[0].batch


def _sorted(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: json.dumps(r, default=str, sort_keys=True))


@pytest.mark.parametrize("sql", FOLLOWED)
@settings(max_examples=12, deadline=None)
@given(data=st.data())
def test_kept_counts_and_sums_follow_writes(tmp_path_factory, sql: str, data) -> None:
    defn = _definition()
    cache = ScanCache(256 << 20)
    root = tmp_path_factory.mktemp("m")
    stores = [CachingLayer(Shard(root / str(p), defn, p), cache) for p in range(P)]
    keys = data.draw(st.lists(st.text("abcdef", min_size=1, max_size=3), min_size=1, max_size=10, unique=True))
    offsets = [0] * P

    def write(n: int) -> None:
        batches: list[list[ChangelogRecord]] = [[] for _ in range(P)]
        for _ in range(n):
            kb = defn.key.serialize(data.draw(st.sampled_from(keys)))
            p = partition_for(kb, P)
            value = data.draw(st.one_of(st.none(), st.fixed_dictionaries({
                "a": st.one_of(st.none(), st.integers(-(1 << 62), 1 << 62)), "g": st.sampled_from(["x", "y", "z", None])})))
            batches[p].append(ChangelogRecord(kb, None if value is None else json.dumps(value).encode(), offsets[p], 0))
            offsets[p] += 1
        for p, records in enumerate(batches):
            if records:
                stores[p].apply(records)

    def expected() -> list[dict]:
        return _duck(sql, pa.Table.from_batches([s.base.store_type.handler_for(RangeQuery())(s.base._view(), RangeQuery())
                                                 for s in stores]))

    try:
        write(data.draw(st.integers(1, 8)))
        got = _owner_answer(stores, cache, sql)
        assert _sorted(got.to_pylist()) == _sorted(expected())
        for _ in range(data.draw(st.integers(1, 3))):
            for _ in range(data.draw(st.integers(1, 2))):  # one write or two between the answers
                write(data.draw(st.integers(1, 6)))
                if data.draw(st.booleans()):
                    [s.run(RangeQuery()) for s in stores]  # a scan between: the result follows two steps
            before, folded = cache.maintained, cache.followed
            got = _node_answer(stores, cache, sql)
            assert _sorted(got.to_pylist()) == _sorted(expected())
            if "MIN" in sql or "MAX" in sql:
                continue  # followed, or computed again where the write took an extreme away
            assert cache.followed == folded  # the scans were neither read nor brought up to date
            assert got.schema == DUCK.over_rows(sql, pa.Table.from_batches(
                [s.run(RangeQuery()).batch for s in stores])).schema
            assert cache.maintained == before + 1  # from the changed rows, not every row
    finally:
        for s in stores:
            s.close()


def _duck(sql: str, rows: pa.Table) -> list[dict]:
    return DUCK.over_rows(sql, rows).to_pylist()


def test_statements_that_cannot_be_followed_exactly_are_not() -> None:
    for sql in ['SELECT MEDIAN("a") AS "__a0" FROM rows',
                'SELECT COUNT(*) AS "__a0" FROM rows WHERE "a" > 1',
                'SELECT SUM("a" + 1) AS "__a0" FROM rows',
                'SELECT "g" || \'x\' AS "__g0", COUNT(*) AS "__a0" FROM rows GROUP BY "g" || \'x\'',
                'SELECT COUNT(DISTINCT "a") AS "__a0" FROM rows',
                'SELECT "a" FROM rows']:
        assert maintained(sql) is None, sql
    m = maintained('SELECT SUM("a") AS "__a0" FROM rows')
    assert m is not None
    rows = pa.table({"a": [1.5, 2.0]})  # a double sum depends on the order of its additions
    assert m.follow(DUCK.over_rows(m.sql, rows), [pa.record_batch({"a": [0.1]})], []) is None
    g = maintained('SELECT "f" AS "__g0", COUNT(*) AS "__a0" FROM rows GROUP BY "f"')
    kept = DUCK.over_rows(g.sql, pa.table({"f": [0.0, float("nan")]}))  # NaN and -0.0 group as DuckDB says
    assert g.follow(kept, [pa.record_batch({"f": [-0.0]})], []) is None


def test_a_sum_that_leaves_its_range_is_computed_again() -> None:
    m = maintained('SELECT SUM("a") AS "__a0" FROM rows')
    top = Decimal(10 ** 38 - 1)
    kept = pa.record_batch({"__a0": pa.array([top], pa.decimal128(38, 0)), "__n": [1], "__n0": [1]})
    assert m.follow(kept, [pa.record_batch({"a": [1]})], []) is None
    assert m.follow(kept, [pa.record_batch({"a": [-1]})], [])["__a0"].to_pylist() == [Decimal(10 ** 38 - 2)]


def test_groups_whose_rows_all_went_go_and_sums_of_no_values_are_null() -> None:
    m = maintained('SELECT "g" AS "__g0", COUNT("a") AS "__a0", SUM("a") AS "__a1" FROM rows GROUP BY "g"')
    rows = pa.table({"g": ["x", "x", "y"], "a": [1, None, 5]})
    kept = DUCK.over_rows(m.sql, rows)
    gone = pa.record_batch({"g": ["x", "y"], "a": [1, 5]})
    back = pa.record_batch({"g": ["x"], "a": pa.array([None], pa.int64())})
    got = m.follow(kept, [back], [gone])  # x keeps two NULL rows (the old and the new), y is empty
    assert got.to_pylist() == [{"__g0": "x", "__a0": 0, "__a1": None, "__n": 2, "__n0": 0}]
    assert m.visible_part(got).schema.names == ["__g0", "__a0", "__a1"]


def test_a_kept_result_over_scans_it_follows_two_ways_is_the_same(tmp_path) -> None:
    """Made over the scans, then followed without them, then over scans brought up to date:
    each answer is the statement's over the rows, and a bound the shard is short of is not
    answered from the kept result."""
    defn = _definition()
    cache = ScanCache(256 << 20)
    stores = [CachingLayer(Shard(tmp_path / str(p), defn, p), cache) for p in range(P)]
    sql = FOLLOWED[2]
    rows: dict[str, dict] = {}

    def write(key: str, value: dict | None, offset: int) -> None:
        kb = defn.key.serialize(key)
        p = partition_for(kb, P)
        stores[p].apply([ChangelogRecord(kb, None if value is None else json.dumps(value).encode(), offset, 0)])
        rows.pop(key, None) if value is None else rows.__setitem__(key, value)

    def want() -> list[dict]:
        table = pa.table({"key": list(rows), "a": pa.array([r["a"] for r in rows.values()], pa.int64()),
                          "g": [r["g"] for r in rows.values()]})
        return _sorted(DUCK.over_rows(sql, table).to_pylist())

    try:
        for i, k in enumerate("abcdef"):
            write(k, {"a": i, "g": "xy"[i % 2]}, i)
        assert _sorted(_owner_answer(stores, cache, sql).to_pylist()) == want()
        write("a", {"a": 100, "g": "y"}, 10)
        write("c", None, 11)
        write("q", {"a": 7, "g": "z"}, 12)
        folded = cache.followed
        got = followed_answer(sql, list(enumerate(stores)), UNBOUNDED, cache)
        assert got is not None and cache.followed == folded
        assert _sorted(got[0].batch.to_pylist()) == want()
        write("b", {"a": 1, "g": "z"}, 13)
        assert _sorted(_owner_answer(stores, cache, sql).to_pylist()) == want()  # scans folded, result followed
        assert cache.followed > folded
        write("d", None, 14)
        ahead = PositionBound(Position({"t": {p: 1000 for p in range(P)}}))
        assert followed_answer(sql, list(enumerate(stores)), ahead, cache) is None
        assert _sorted(_node_answer(stores, cache, sql).to_pylist()) == want()
    finally:
        for s in stores:
            s.close()


def test_a_min_or_max_follows_until_its_extreme_goes() -> None:
    m = maintained('SELECT "g" AS "__g0", MIN("a") AS "__a0", MAX("a") AS "__a1" FROM rows GROUP BY "g"')
    rows = pa.table({"g": ["x", "x", "x", "y"], "a": [1, 5, 9, None]})
    kept = DUCK.over_rows(m.sql, rows)

    def batch(**columns: list) -> pa.RecordBatch:
        return pa.record_batch({"g": columns["g"], "a": pa.array(columns["a"], pa.int64())})

    got = m.follow(kept, [batch(g=["x", "y"], a=[7, 3])], [batch(g=["x"], a=[5])])  # 5 -> 7, y gets a value
    assert sorted(got.to_pylist(), key=str) == sorted(DUCK.over_rows(m.sql, pa.table(
        {"g": ["x", "x", "x", "y", "y"], "a": [1, 7, 9, None, 3]})).to_pylist(), key=str)
    assert m.follow(kept, [batch(g=["x"], a=[2])], [batch(g=["x"], a=[9])]) is None  # the max went: run again
    assert m.follow(kept, [], [batch(g=["x"], a=[1])]) is None  # and the min
    moved = m.follow(kept, [batch(g=["x"], a=[0])], [batch(g=["x"], a=[5])]).to_pylist()
    assert [r["__a0"] for r in moved if r["__g0"] == "x"] == [0]  # DuckDB's groups come in any order
    doubles = maintained('SELECT MAX("d") AS "__a0" FROM rows')
    kept = DUCK.over_rows(doubles.sql, pa.table({"d": [1.0, float("nan")]}))  # DuckDB puts NaN last
    assert doubles.follow(kept, [pa.record_batch({"d": [2.0]})], []) is None
