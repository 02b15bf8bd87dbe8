"""RangeQuery on a real shard returns keys in value order, for every key format.

The key property: whatever keys are stored and whatever the bounds, a RangeQuery
returns exactly Python's sorted, filtered list of keys (reversed when descending).
"""

from __future__ import annotations

import math
import struct
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from federator.catalog import StoreDefinition
from federator.query import RangeQuery
from federator.store import ChangelogRecord, Shard
from tests.registry import REGISTRY

LONG_MIN, LONG_MAX = -(1 << 63), (1 << 63) - 1
INT_MIN, INT_MAX = -(1 << 31), (1 << 31) - 1

SETTINGS = settings(
    max_examples=60,  # derandomized like every test (tests/conftest.py): failures reproduce
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def kv_definition(key_format: str) -> StoreDefinition:
    return StoreDefinition.from_dict(
        {
            "name": "ranges",
            "type": "kv",
            "topic": "ranges-changelog",
            "partitions": 1,
            "key": {"name": "k", "format": key_format},
            "value": {"format": "long", "name": "v"},
        },
        REGISTRY,
    )


def sort_key(key_format: str) -> Callable[[Any], Any]:
    if key_format == "double":
        # numeric order; -0.0 before 0.0 as Java's Double.compare has it
        return lambda x: (x, math.copysign(1.0, x))
    return lambda x: x


def identity(key_format: str) -> Callable[[Any], Any]:
    """Compare doubles bit for bit, so -0.0 and 0.0 are told apart."""
    if key_format == "double":
        return lambda x: struct.pack(">d", x)
    return lambda x: x


def expected_keys(key_format: str, keys: list, q: RangeQuery) -> list:
    def keep(k) -> bool:
        if q.lower is not None and (k < q.lower if q.lower_inclusive else k <= q.lower):
            return False
        if q.upper is not None and (k > q.upper if q.upper_inclusive else k >= q.upper):
            return False
        return True

    out = sorted((k for k in keys if keep(k)), key=sort_key(key_format))
    return out[::-1] if q.descending else out


def run_range(shard: Shard, q: RangeQuery, with_values: bool = False):
    result = shard.run(q)
    assert result.ok, f"{q}: {result.failure} {result.message}"
    assert result.batch.schema == shard.schema
    keys = result.batch.column(0).to_pylist()
    return (keys, result.batch.column(1).to_pylist()) if with_values else keys


class Loaded:
    """One open shard per key format, reused across examples: each example first deletes
    the previous example's keys with tombstones, then writes its own."""

    def __init__(self, root: Path, key_format: str) -> None:
        self.key_format = key_format
        self.defn = kv_definition(key_format)
        self.shard = Shard(root / key_format, self.defn, 0)
        self.present: list[bytes] = []
        self.offset = 0

    def load(self, keys: list) -> list:
        ident = identity(self.key_format)
        unique = list({ident(k): k for k in keys}.values())
        records = []
        for kb in self.present:
            records.append(ChangelogRecord(kb, None, self.offset, 0))
            self.offset += 1
        for i, k in enumerate(unique):
            records.append(ChangelogRecord(self.defn.key.serialize(k), struct.pack(">q", i), self.offset, 1000 + i))
            self.offset += 1
        self.shard.apply(records)
        self.present = [self.defn.key.serialize(k) for k in unique]
        return unique


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Loaded]]:
    root = tmp_path_factory.mktemp("ranges")
    opened = {f: Loaded(root, f) for f in ("long", "int", "double", "string", "bytes")}
    yield opened
    for o in opened.values():
        o.shard.close()


def check_ranges(loaded: Loaded, keys: list, queries: list[RangeQuery]) -> None:
    key_format, shard = loaded.key_format, loaded.shard
    ident = identity(key_format)
    unique = loaded.load(keys)
    index = {ident(k): i for i, k in enumerate(unique)}
    for q in queries:
        got, values = run_range(shard, q, with_values=True)
        want = expected_keys(key_format, unique, q)
        assert [ident(k) for k in got] == [ident(k) for k in want], f"{q} over {sorted(unique, key=sort_key(key_format))}"
        # values travel with their keys
        assert values == [index[ident(k)] for k in got]


def queries(bound: st.SearchStrategy) -> st.SearchStrategy:
    return st.lists(
        st.builds(
            RangeQuery,
            lower=st.none() | bound,
            upper=st.none() | bound,
            lower_inclusive=st.booleans(),
            upper_inclusive=st.booleans(),
            descending=st.booleans(),
        ),
        min_size=1,
        max_size=6,
    )


def ints(lo: int, hi: int) -> st.SearchStrategy:
    return st.sampled_from([lo, lo + 1, -2, -1, 0, 1, 2, hi - 1, hi]) | st.integers(min_value=lo, max_value=hi) | st.integers(-20, 20)


LONGS = ints(LONG_MIN, LONG_MAX)
INTS = ints(INT_MIN, INT_MAX)
DOUBLES = st.sampled_from([-0.0, 0.0, -math.inf, math.inf, 5e-324, -5e-324, 1.7976931348623157e308, -1.0, 1.0]) | st.floats(
    allow_nan=False
) | st.integers(-5, 5).map(float)
STRINGS = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=6) | st.sampled_from(
    ["", "a", "a\x00", "ab", "b", "é", "\uffff", "\U0010ffff", "😀"]
)
BYTES = st.binary(max_size=5)


@SETTINGS
@given(st.lists(LONGS, max_size=25), queries(LONGS))
@example([LONG_MIN, -1, 0, 1, LONG_MAX], [RangeQuery()])
@example([LONG_MIN, -1, 0, 1, LONG_MAX], [RangeQuery(descending=True)])
@example([-5, 3], [RangeQuery(lower=-10, upper=10, descending=True)])
def test_long_ranges(shards: dict[str, Loaded], keys: list[int], qs: list[RangeQuery]) -> None:
    check_ranges(shards["long"], keys, qs)


@SETTINGS
@given(st.lists(INTS, max_size=25), queries(INTS))
@example([INT_MIN, -1, 0, 1, INT_MAX], [RangeQuery(), RangeQuery(descending=True)])
def test_int_ranges(shards: dict[str, Loaded], keys: list[int], qs: list[RangeQuery]) -> None:
    check_ranges(shards["int"], keys, qs)


@SETTINGS
@given(st.lists(DOUBLES, max_size=25), queries(DOUBLES))
@example([-math.inf, -1.5, -0.0, 0.0, 2.5, math.inf], [RangeQuery(), RangeQuery(descending=True)])
def test_double_ranges(shards: dict[str, Loaded], keys: list[float], qs: list[RangeQuery]) -> None:
    check_ranges(shards["double"], keys, qs)


@SETTINGS
@given(st.lists(STRINGS, max_size=25), queries(STRINGS))
@example(["b", "a", "ab", "é", "😀", "\uffff", "Z"], [RangeQuery(), RangeQuery(descending=True)])
def test_string_ranges(shards: dict[str, Loaded], keys: list[str], qs: list[RangeQuery]) -> None:
    check_ranges(shards["string"], keys, qs)


@SETTINGS
@given(st.lists(BYTES, max_size=25), queries(BYTES))
def test_bytes_ranges(shards: dict[str, Loaded], keys: list[bytes], qs: list[RangeQuery]) -> None:
    check_ranges(shards["bytes"], keys, qs)


# ---- the edges, one at a time (each also reachable by the properties above) ----------------


@pytest.mark.parametrize(
    ("key_format", "q", "expected"),
    [
        ("long", RangeQuery(lower=LONG_MAX, lower_inclusive=False), []),
        ("long", RangeQuery(upper=LONG_MIN, upper_inclusive=False), []),
        ("long", RangeQuery(lower=LONG_MAX - 1, lower_inclusive=False), [LONG_MAX]),
        ("long", RangeQuery(lower=-1, upper=1, lower_inclusive=False, upper_inclusive=False), [0]),
        ("long", RangeQuery(lower=1, upper=-1), []),
        ("int", RangeQuery(lower=INT_MAX, lower_inclusive=False), []),
        ("int", RangeQuery(upper=INT_MIN, upper_inclusive=False), []),
    ],
)
def test_integer_range_edges(shards: dict[str, Loaded], key_format: str, q: RangeQuery, expected: list) -> None:
    lo, hi = (LONG_MIN, LONG_MAX) if key_format == "long" else (INT_MIN, INT_MAX)
    loaded = shards[key_format]
    loaded.load([lo, -1, 0, 1, hi - 1, hi])
    assert run_range(loaded.shard, q) == expected


@pytest.mark.parametrize(
    ("q", "expected_bits"),
    [
        # -0.0 == 0.0, so "< 0.0" holds neither zero
        (RangeQuery(upper=0.0, upper_inclusive=False), ["-1.0"]),
        (RangeQuery(upper=-0.0, upper_inclusive=False), ["-1.0"]),
        # "<= -0.0" holds both zeros and nothing positive
        (RangeQuery(upper=-0.0), ["-1.0", "-0.0", "0.0"]),
        (RangeQuery(upper=0.0), ["-1.0", "-0.0", "0.0"]),
        # "> -0.0" is "> 0.0"
        (RangeQuery(lower=-0.0, lower_inclusive=False), ["1.0"]),
        (RangeQuery(lower=0.0, lower_inclusive=False), ["1.0"]),
        (RangeQuery(lower=-0.0), ["-0.0", "0.0", "1.0"]),
        (RangeQuery(lower=-0.0, upper=0.0), ["-0.0", "0.0"]),
        (RangeQuery(lower=0.0, upper=-0.0), ["-0.0", "0.0"]),
    ],
)
def test_double_signed_zero_bounds(shards: dict[str, Loaded], q: RangeQuery, expected_bits: list[str]) -> None:
    loaded = shards["double"]
    loaded.load([-1.0, -0.0, 0.0, 1.0])
    assert [repr(k) for k in run_range(loaded.shard, q)] == expected_bits


def test_ors_of_key_ranges_become_disjoint_range_queries() -> None:
    import sqlglot

    from federator.catalog import StoreDefinition
    from federator.plan.keys import plan_store_queries
    from federator.query.queries import RangeQuery

    defn = StoreDefinition.from_dict({"name": "s", "type": "kv", "topic": "t", "partitions": 4,
                                      "key": {"name": "k", "format": "long"}, "value": {"format": "long"}}, REGISTRY)

    def plan(where: str) -> list:
        return [sq.query for sq in plan_store_queries(defn, sqlglot.parse_one(where, read="duckdb"), [])]

    assert plan("k < -280 OR k > 290") == [RangeQuery(None, -280, True, False), RangeQuery(290, None, False, True)]
    assert plan("k BETWEEN 1 AND 10 OR k BETWEEN 5 AND 20 OR k = 30") == [
        RangeQuery(1, 20, True, True), RangeQuery(30, 30, True, True)]
    # adjoining bounds merge only when one side includes the shared value
    assert plan("k < 5 OR k >= 5") == [RangeQuery(None, None, True, True)]
    assert plan("k < 5 OR k > 5") == [RangeQuery(None, 5, True, False), RangeQuery(5, None, False, True)]
    assert plan("k > 100 OR k BETWEEN 0 AND 3 OR k < -7") == [
        RangeQuery(None, -7, True, False), RangeQuery(0, 3, True, True), RangeQuery(100, None, False, True)]
