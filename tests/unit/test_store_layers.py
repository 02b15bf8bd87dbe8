"""A store is a stack of layers (federator.store.layer): each answers ``run(query, bound)`` or
passes it down; the scan cache layer serves a kept scan and follows writes; metering counts;
the point lookup is a LocalKeyQuery down the stack, decoded by the store type."""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pytest
import sqlglot

from federator.catalog import StoreDefinition
from federator.query import KeyQuery, Position, PositionBound, RangeQuery
from federator.query.result import FailureReason, QueryResult
from federator.sql.point import point_plan
from federator.store import ChangelogRecord, LocalKeyQuery, Shard, StoredEntry, StoreLayer, StoreType
from federator.store.shard_answers import ShardAnswers
from federator.store.layer import UNBOUNDED, WrappedLayer
from federator.store.metered import Meter, MeteredLayer
from federator.store.scan_cache import CachingLayer, ScanCache
from federator.store.stack import open_store
from tests.registry import REGISTRY


def _definition(value: dict | None = None) -> StoreDefinition:
    return StoreDefinition.from_dict({"name": "s", "type": "kv", "topic": "t", "partitions": 1,
                                      "key": {"name": "k", "format": "string"},
                                      "value": value or {"name": "v", "format": "long"}}, REGISTRY)


class FakeBottom(StoreLayer):
    """A bottom layer that notes what reached it."""

    def __init__(self) -> None:
        self.definition = _definition()
        self.partition = 0
        self.topic = "t"
        self.seen: list[Any] = []
        self.applied: list[Any] = []

    @property
    def base(self) -> Any:
        return self

    def run(self, query: Any, bound: PositionBound = UNBOUNDED, collect_execution_info: bool = False) -> Any:
        self.seen.append(query)
        if isinstance(query, LocalKeyQuery):
            return StoredEntry(b"x", Position())
        return QueryResult.success(0, pa.record_batch({"k": ["a", "b"]}), Position())

    def apply(self, records: Any, through: int | None = None) -> tuple[int, int]:
        self.applied.extend(records)
        return 0, 2


class AnswersKeys(WrappedLayer):
    """A layer that answers KeyQuery itself and passes everything else down."""

    def run(self, query: Any, bound: PositionBound = UNBOUNDED, collect_execution_info: bool = False) -> Any:
        if type(query) is KeyQuery:
            return QueryResult.success(0, pa.record_batch({"k": ["mine"]}), Position())
        return super().run(query, bound, collect_execution_info)


def test_a_layer_answers_what_it_knows_and_passes_the_rest_down() -> None:
    bottom = FakeBottom()
    store = AnswersKeys(bottom)
    assert store.run(KeyQuery("a")).batch.column(0).to_pylist() == ["mine"] and bottom.seen == []
    assert store.run(RangeQuery()).batch.num_rows == 2 and bottom.seen == [RangeQuery()]
    store.apply(["r"])  # writes go down to the shard
    assert bottom.applied == ["r"] and store.base is bottom and store.definition is bottom.definition


def test_a_local_key_query_skips_layers_that_only_pass_it_down() -> None:
    bottom = FakeBottom()
    store = MeteredLayer(CachingLayer(bottom, ScanCache(1 << 20)), Meter())
    assert store.inner.key_layer is bottom  # the cache layer does nothing with it
    got = store.run(LocalKeyQuery(b"k"))
    assert got.stored == b"x" and [type(q) for q in bottom.seen] == [LocalKeyQuery]


def test_metering_counts_queries_rows_and_failures_per_store_and_type() -> None:
    class Failing(FakeBottom):
        def run(self, query: Any, bound: PositionBound = UNBOUNDED, collect_execution_info: bool = False) -> Any:
            return None if isinstance(query, LocalKeyQuery) else super().run(query, bound)

    meter = Meter()
    store = MeteredLayer(FakeBottom(), meter)
    store.run(RangeQuery())
    store.run(RangeQuery())
    store.run(LocalKeyQuery(b"k"))
    MeteredLayer(Failing(), meter).run(LocalKeyQuery(b"k"))
    stats = meter.stats()["s"]
    assert stats["RangeQuery"]["queries"] == 2 and stats["RangeQuery"]["rows"] == 4
    assert stats["LocalKeyQuery"] == {"queries": 2, "rows": 1, "failed": 1, "ms": stats["LocalKeyQuery"]["ms"]}


def _long(n: int) -> bytes:
    return struct.pack(">q", n)


def test_the_cache_layer_serves_a_kept_scan_and_follows_writes(tmp_path: Path) -> None:
    cache = ScanCache(1 << 20)
    store = open_store(tmp_path / "p", _definition(), 0, cache, Meter())
    try:
        store.apply([ChangelogRecord(b"a", _long(1), 0, 5), ChangelogRecord(b"b", _long(2), 1, 5)])
        first = store.run(RangeQuery())
        assert store.run(RangeQuery()).batch is first.batch and cache.hits == 1  # kept: no second read
        before = cache.stats()["bytes"]
        store.apply([ChangelogRecord(b"a", _long(10), 2, 6)])
        assert cache.stats()["bytes"] > before  # the held write counts against the budget
        after = store.run(RangeQuery())
        assert cache.followed == 1 and after.batch.column(1).to_pylist() == [10, 2]
        assert after.position.get("t", 0) == 2
        assert store.run(KeyQuery("b")).batch.column(1).to_pylist() == [2]  # not a scan: passed down
    finally:
        store.close()
    assert cache.stats()["entries"] == 0  # closing the store drops its scan


def test_held_writes_past_the_budget_drop_the_kept_scan(tmp_path: Path) -> None:
    cache = ScanCache(2_000)
    store = CachingLayer(Shard(tmp_path / "p", _definition(), 0), cache)
    try:
        store.apply([ChangelogRecord(b"a", _long(1), 0, 5)])
        store.run(RangeQuery())
        assert cache.stats()["entries"] == 1
        store.apply([ChangelogRecord(b"k%d" % i, _long(i), 1 + i, 5) for i in range(20)])
        assert cache.stats()["entries"] == 0 and cache.stats()["bytes"] == 0
    finally:
        store.close()


def test_a_point_lookup_is_decoded_by_the_store_type(tmp_path: Path) -> None:
    defn = _definition({"format": "json", "fields": [{"name": "a", "type": "long"}, {"name": "b", "type": "string"}]})
    shard = Shard(tmp_path / "p", defn, 0)
    try:
        shard.apply([ChangelogRecord(b"k1", b'{"a": 7, "b": "x"}', 0, 1_000)])
        entry = shard.run(LocalKeyQuery(b"k1"))
        assert entry.position.get("t", 0) == 0
        row = defn.store_type.decode_row(defn, b"k1", entry.stored)
        batch = shard.run(KeyQuery("k1")).batch
        assert row[:3] == tuple(batch.to_pylist()[0].values())[:3] and row[3] == 1_000  # rowtime in ms
        for sql, want in [("SELECT b, a FROM s WHERE k = ?", [("x", 7)]), ("SELECT rowtime, k FROM s WHERE k = ?", [(1_000, "k1")]),
                          ("SELECT * FROM s WHERE k = ?", [("k1", 7, "x")])]:
            plan = point_plan(sqlglot.parse_one(sql), {"s": defn})
            assert plan.answer(b"k1", entry.stored).rows == want, sql
        assert plan.answer(b"k2", shard.run(LocalKeyQuery(b"k2")).stored).rows == []
        assert shard.run(LocalKeyQuery(b"k1"), PositionBound.at(Position({"t": {0: 5}}))) is None  # behind the bound
    finally:
        shard.close()


def test_a_type_that_does_not_decode_entries_sends_the_point_lookup_to_the_general_path(tmp_path: Path) -> None:
    defn = _definition()
    plan = point_plan(sqlglot.parse_one("SELECT v FROM s WHERE k = ?"), {"s": defn})
    plan.__dict__["_decode"] = StoreType.row_decoder(defn.store_type, defn)  # the base type's: None
    assert plan.answer(b"k", _long(0) + _long(1)) is None


def test_a_failed_key_read_is_logged_not_swallowed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    shard = Shard(tmp_path / "p", _definition(), 0)

    class Broken:
        def get(self, key: bytes) -> bytes:
            raise OSError("disk on fire")

    db, shard.db = shard.db, Broken()  # type: ignore[assignment]
    try:
        with caplog.at_level(logging.WARNING, logger="federator.store.shard"):
            assert shard.run(LocalKeyQuery(b"k")) is None
        assert "key read failed" in caplog.text and "disk on fire" in caplog.text
    finally:
        shard.db = db
        shard.close()


# ---- kept answers: a repeated query answered from what the shard computed at the same write ---
def test_a_repeated_query_is_answered_from_its_kept_answer_until_the_next_write(tmp_path: Path) -> None:
    kept = ShardAnswers(per_shard=2)
    store = open_store(tmp_path / "p", _definition(), 0, ScanCache(1 << 20), Meter(), kept=kept)
    try:
        store.apply([ChangelogRecord(k, _long(n), n, 5) for n, k in enumerate((b"a", b"b", b"c"))])
        some = RangeQuery("a", "b")
        first = store.run(some)
        again = store.run(some)
        assert again.batch is first.batch and again.position == first.position and kept.hits == 1
        store.apply([ChangelogRecord(b"a", _long(10), 3, 6)])
        after = store.run(some)  # the write moved the shard: computed again, with the write in it
        assert after.batch.column(1).to_pylist() == [10, 1] and after.position.get("t", 0) == 3
        assert kept.hits == 1 and store.run(some).batch is after.batch and kept.hits == 2
        # a bound the kept answer does not meet is the shard's to refuse, as ever
        short = store.run(some, PositionBound.at(Position.of("t", 0, 9)))
        assert short.failure is FailureReason.NOT_UP_TO_BOUND
        # full scans are the scan cache's, and execution info reports a read: neither is kept here
        computed = kept.computed
        store.run(RangeQuery())
        store.run(RangeQuery())
        assert kept.computed == computed
        info = store.run(some, collect_execution_info=True)
        assert info.execution_info and kept.computed == computed
        # two answers kept per shard: the one asked longest ago goes first
        store.run(RangeQuery("b", "c"))
        store.run(RangeQuery("c", "c"))
        hits = kept.hits
        store.run(some)
        assert kept.hits == hits and kept.computed == computed + 3
    finally:
        store.close()


def test_a_query_type_whose_answer_depends_on_more_than_the_data_is_computed_each_time(tmp_path: Path) -> None:
    @dataclass(frozen=True)
    class Clocked(RangeQuery):  # a plugin query whose handler would read the clock
        type_name: ClassVar[str] = "Clocked"
        reusable: ClassVar[bool] = False

    kept = ShardAnswers()
    store = open_store(tmp_path / "p", _definition(), 0, ScanCache(1 << 20), Meter(), kept=kept)
    try:
        store.apply([ChangelogRecord(b"a", _long(1), 0, 5)])
        inner = store.inner.inner  # below the kept-answer layer
        seen: list[Any] = []
        run = inner.run
        inner.run = lambda q, *a: seen.append(q) or run(RangeQuery("a", "b"), *a)  # type: ignore[method-assign]
        for _ in range(2):
            store.run(Clocked("a", "b"))
        assert len(seen) == 2 and kept.hits == 0
        listed = RangeQuery(["a"], "b")  # a field that cannot be hashed: computed each time, no error
        for _ in range(2):
            assert store.run(listed).ok
        assert len(seen) == 4 and kept.hits == 0
    finally:
        store.close()
