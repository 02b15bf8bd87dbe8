"""Aggregates kept up to date from writes equal computing them again over the shard, for any
sequence of upserts and deletes (NULL values included), and report the position they reflect."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from federator.catalog import StoreDefinition
from federator.query.queries import RangeQuery
from federator.sql.incremental import maintained_aggregate
from federator.sql.pipeline import Pipeline, as_batch, run
from federator.store.record import ChangelogRecord
from federator.store.scan_cache import SCAN_CACHE
from federator.store.shard import Shard

FAST = settings(max_examples=12, database=None, deadline=None)

DEFN = StoreDefinition.from_dict({
    "name": "s", "type": "kv", "topic": "t", "partitions": 1, "key": {"name": "k", "format": "string"},
    "value": {"format": "json", "fields": [{"name": "n", "type": "long"}, {"name": "g", "type": "string"}]}})

MAINTAINED = {
    "count, sum, avg": Pipeline(aggregate=True, aggs=(("COUNT", None, False, "c"), ("COUNT", "n", False, "cn"),
                                                      ("SUM", "n", False, "s"), ("AVG", "n", False, "a"))),
    "grouped, filtered": Pipeline(aggregate=True, where="n > -3 OR n IS NULL", group_by=("g",),
                                  aggs=(("sum", "n * 2", False, "s"), ("count", None, False, "c"))),  # as the planner names them
    "grouped by a nullable expression": Pipeline(aggregate=True, group_by=("n % 3", "g"),
                                                 aggs=(("AVG", "n", False, "a"),)),
}
NOT_MAINTAINED = {
    "MIN": Pipeline(aggregate=True, aggs=(("MIN", "n", False, "m"),)),
    "COUNT DISTINCT": Pipeline(aggregate=True, aggs=(("COUNT", "n", True, "d"),)),
    "SUM of doubles": Pipeline(aggregate=True, aggs=(("SUM", "n * 0.5", False, "s"),)),
    "not an aggregate": Pipeline(where="n > 0"),
}


def _key(p: Pipeline) -> str:
    return json.dumps(p.to_dict(), sort_keys=True, default=str)


def _rows(batch: pa.RecordBatch) -> list[tuple]:
    return sorted((tuple(r.values()) for r in batch.to_pylist()), key=repr)


def _computed_again(shard: Shard, p: Pipeline) -> pa.RecordBatch:
    scan = shard.store_type.handler_for(RangeQuery())(shard._view(), RangeQuery())
    return as_batch(run(p, scan))


@pytest.mark.parametrize("name", sorted(MAINTAINED))
@FAST
@given(data=st.data())
def test_a_maintained_aggregate_equals_computing_it_again(tmp_path_factory, name: str, data) -> None:
    pipeline = MAINTAINED[name]
    shard = Shard(tmp_path_factory.mktemp("s") / "p", DEFN, 0)
    aggregate = maintained_aggregate(_key(pipeline), shard.schema)
    assert aggregate is not None
    keys = data.draw(st.lists(st.text(max_size=3), min_size=1, max_size=10, unique=True))
    offset = 0

    def write(n: int) -> None:
        nonlocal offset
        records = []
        for _ in range(n):
            k = DEFN.key.serialize(data.draw(st.sampled_from(keys)))
            value = data.draw(st.one_of(st.none(), st.fixed_dictionaries({
                "n": st.one_of(st.none(), st.integers(-5, 5)), "g": st.sampled_from([None, "a", "b"])})))
            records.append(ChangelogRecord(k, None if value is None else DEFN.value.serialize(value), offset, offset))
            offset += 1
        shard.apply(records)

    try:
        write(data.draw(st.integers(0, 8)))
        shard.query(RangeQuery())  # the scan is kept from here on
        for _ in range(data.draw(st.integers(1, 4))):
            write(data.draw(st.integers(1, 8)))
            before = SCAN_CACHE.maintained
            result = shard.run_maintained(aggregate)
            assert result is not None and result.ok
            assert SCAN_CACHE.maintained == before + 1  # brought up to date, not computed again
            want = _computed_again(shard, pipeline)
            assert result.batch.schema.equals(want.schema), (result.batch.schema, want.schema)
            assert _rows(result.batch) == _rows(want)
            assert result.position.get("t", 0) == offset - 1
            if data.draw(st.booleans()):  # a full scan folds the writes in; the state carries over
                shard.query(RangeQuery())
                assert SCAN_CACHE.state(shard, SCAN_CACHE.kept(shard, shard._seq)[0], aggregate.key)[0] == 0
    finally:
        shard.close()


@pytest.mark.parametrize("name", sorted(NOT_MAINTAINED))
def test_aggregates_whose_state_cannot_be_taken_back_are_computed_again(tmp_path: Path, name: str) -> None:
    shard = Shard(tmp_path / "p", DEFN, 0)
    assert maintained_aggregate(_key(NOT_MAINTAINED[name]), shard.schema) is None
    shard.close()


def test_without_a_kept_scan_or_with_an_unmet_bound_the_shard_is_read(tmp_path: Path) -> None:
    from federator.query.position import Position, PositionBound

    shard = Shard(tmp_path / "p", DEFN, 0)
    aggregate = maintained_aggregate(_key(MAINTAINED["count, sum, avg"]), shard.schema)
    shard.apply([ChangelogRecord(b"a", DEFN.value.serialize({"n": 1, "g": "x"}), 0, 0)])
    assert shard.run_maintained(aggregate) is None  # nothing kept yet
    shard.query(RangeQuery())
    assert shard.run_maintained(aggregate).batch.to_pylist()[0]["__a0_count"] == 1
    ahead = PositionBound.at(Position({"t": {0: 5}}))
    assert shard.run_maintained(aggregate, ahead) is None
    shard.close()


KEYS = {
    "string": st.text(max_size=4),
    "bytes": st.binary(max_size=4),
    "long": st.integers(-(1 << 63), (1 << 63) - 1),
    "int": st.integers(-(1 << 31), (1 << 31) - 1),
}


@pytest.mark.parametrize("key_format", sorted(KEYS))
@FAST
@given(data=st.data())
def test_written_keys_are_found_in_a_scan_by_bisection_and_by_a_vectorized_pass(tmp_path_factory, key_format: str,
                                                                               data) -> None:
    """Bisection relies on a scan's key order being Python's order for these key formats."""
    from federator.store import kv

    defn = StoreDefinition.from_dict({"name": "s", "type": "kv", "topic": "t", "partitions": 1,
                                      "key": {"name": "k", "format": key_format}, "value": {"format": "long"}})
    stored = data.draw(st.lists(KEYS[key_format], max_size=40, unique=True))
    probes = data.draw(st.lists(st.one_of(st.sampled_from(stored), KEYS[key_format]) if stored else KEYS[key_format],
                                max_size=40, unique=True))
    shard = Shard(tmp_path_factory.mktemp("s") / "p", defn, 0)
    try:
        shard.apply([ChangelogRecord(defn.key.serialize(k), b"\0" * 8, i, i) for i, k in enumerate(stored)])
        scan = shard.store_type.handler_for(RangeQuery())(shard._view(), RangeQuery())
        probe_array = defn.key.decode_many([defn.key.serialize(k) for k in probes])
        want = sorted(i for i, k in enumerate(scan.column(0).to_pylist()) if k in set(probe_array.to_pylist()))
        bisected = kv._rows_of(scan.column(0), probe_array).to_pylist() if len(probes) <= kv._BISECT_KEYS else None
        assert bisected in (None, want)
        saved, kv._BISECT_KEYS = kv._BISECT_KEYS, -1
        try:
            assert kv._rows_of(scan.column(0), probe_array).to_pylist() == want
        finally:
            kv._BISECT_KEYS = saved
    finally:
        shard.close()
