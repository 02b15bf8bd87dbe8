"""The bytes the sink produces are the store's: every key and value equals what the store
definition's formats serialize (``defn.key.serialize``, ``defn.value.serialize``), every
changelog key is what ``federator.store.layout`` builds (window: + start + seqnum 0; session:
+ end + start), every record goes to its plain key's partition with its layout's record time,
and tombstones carry no value. For every built-in format and store type.

Three ways in, cheapest first:
- the worker's code (``producing.produce_batches``) and the tombstones (``deletes``) over
  Arrow columns typed as Spark hands them over, against a stand-in producer (no Spark);
- Spark's own columns (the write's plan, JSON documents built by ``to_json``) through the same
  code, and ``delete_keys`` itself against a stand-in catalog (Spark, no broker);
- the changelogs that ``write_store`` wrote for the test world (Spark and the broker).

JSON values are built by Spark, and Spark writes non-ASCII characters as UTF-8 and doubles as
Java prints them (1.0E-7), where the json format's serialize (Python's json.dumps) writes
``\\u`` escapes and 1e-07. Both are the same JSON document: the test checks that they decode
alike, hold the same tokens in the same order, and are the same bytes wherever the two agree
on how to write a value.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Iterator

import pyarrow as pa
import pytest

from federator import kafka
from federator.catalog import Catalog, StoreDefinition
from federator.formats import JsonFormat
from federator.partitioner import partition_for
from federator.store.layout import changelog_keys, plain_key, session_key, window_key
from federator_spark.sink import PRODUCER_CONFIG, write
from federator_spark.sink.checks import failing
from federator_spark.sink.deletes import tombstones
from federator_spark.sink.encoding import encode
from federator_spark.sink.plan import Plan, plan
from federator_spark.sink.producing import WriteSpec, produce_batches
from tests.integration.changelog_util import read_partition
from tests.registry import REGISTRY
from tests.spark.conftest import (BYTES_ROWS, DOUBLE_ROWS, INT_ROWS, JSON_ROWS, LONG_ROWS, SESSION_ROWS, STRING_ROWS,
                                  T0, WINDOW_ROWS, P, frames)

NOW = 1_717_171_717_171  # kv records' time in the stand-in writes
BUILTIN = next(p for p in REGISTRY.plugins if p.builtin).provides
STORE_TYPES = [w.removeprefix("store type ") for w in BUILTIN if w.startswith("store type ")]
FORMATS = [w.removeprefix("format ") for w in BUILTIN if w.startswith("format ")]
SIMPLE = [f for f in FORMATS if f != "json"]  # json values are documents Spark builds: below


def test_the_built_ins_are_what_this_test_covers():
    assert STORE_TYPES == ["kv", "window", "session", "versioned"]  # versioned: the kv layout
    assert sorted(FORMATS) == ["bytes", "double", "int", "json", "long", "string"]


# ---- a stand-in for Kafka ------------------------------------------------------------------
@dataclass(frozen=True)
class Produced:
    partition: int
    offset: int
    key: bytes
    value: bytes | None
    timestamp: int


class _Message:
    def __init__(self, partition: int, offset: int) -> None:
        self._partition, self._offset = partition, offset

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset


class FakeKafka:
    """Every produce() lands in its partition at once and is delivered; a producer made with
    delivery.report.only.error (the sink's "bulk" one) reports nothing."""

    def __init__(self) -> None:
        self.log: dict[tuple[str, int], list[Produced]] = defaultdict(list)

    def producer(self, bootstrap: str, **config: Any) -> _Producer:
        return _Producer(self, bool(config.get("delivery.report.only.error")))

    def records(self, topic: str) -> list[Produced]:
        return [r for (t, _), recs in sorted(self.log.items()) if t == topic for r in recs]


class _Producer:
    def __init__(self, kafka_: FakeKafka, only_errors: bool) -> None:
        self.kafka, self.only_errors = kafka_, only_errors

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None, partition: int = -1,
                callback: Any = None, on_delivery: Any = None, timestamp: int = 0) -> None:
        assert 0 <= partition and isinstance(key, bytes) and (value is None or isinstance(value, bytes))
        recs = self.kafka.log[(topic, partition)]
        recs.append(Produced(partition, len(recs), key, value, timestamp))
        if callback is not None and not self.only_errors:
            callback(None, _Message(partition, len(recs) - 1))

    def poll(self, timeout: float = 0) -> int:
        return 0

    def flush(self, timeout: float | None = None) -> int:
        return 0


@pytest.fixture
def fake_kafka(monkeypatch) -> FakeKafka:
    from federator_spark.sink import producing

    fake = FakeKafka()
    monkeypatch.setattr(kafka, "producer", fake.producer)
    monkeypatch.setattr(producing, "_PRODUCERS", {})
    monkeypatch.setattr(producing, "_DRIVER_PRODUCERS", {})
    return fake


# ---- what the store expects ----------------------------------------------------------------
def definition(type_: str, key_format: str, value_format: str,
               value_fields: tuple[tuple[str, str], ...] = ()) -> StoreDefinition:
    return StoreDefinition(
        name="s", type=type_, topic="s-changelog", partitions=P, key_format=key_format,
        value_format=value_format, value_fields=value_fields,
        window_size_ms=60_000 if REGISTRY.store_type(type_).window_sized else None, types=REGISTRY,
    )


def expected_key(defn: StoreDefinition, key: Any, t1: int | None, t2: int | None) -> tuple[bytes, bytes]:
    """(changelog key, plain key) as the store's key format and layout make them."""
    plain = defn.key.serialize(key)
    layout = defn.store_type.changelog_layout
    if layout == "window":
        return window_key(plain, t1), plain
    if layout == "session":
        return session_key(plain, t1, t2), plain
    return plain, plain


def expected_time(defn: StoreDefinition, t1: int | None, t2: int | None, now_ms: int | None) -> int | None:
    """The record time (DESIGN.md): kv the write's, window its start, session its end."""
    return {"kv": now_ms, "window": t1, "session": t2}[defn.store_type.changelog_layout]


def same_value(defn: StoreDefinition, got: bytes, value: Any) -> None:
    """``got`` is the value's bytes: the format's serialize, or for a JSON document built by
    Spark the same document (see the module docstring)."""
    want = defn.value.serialize(value)
    if not isinstance(defn.value, JsonFormat):
        assert got == want, (value, got, want)
        return
    assert defn.value.deserialize(got) == defn.value.coerce(value)
    # token for token: the same fields in the same order, the same numbers, null where null
    assert json.dumps(json.loads(got), separators=(",", ":")).encode() == want
    if _written_alike(value):
        assert got == want


def _written_alike(record: dict[str, Any]) -> bool:
    """Whether Spark (Jackson) and Python's json write ``record`` in the same bytes: ASCII
    strings, and doubles that both print in plain decimal notation."""
    for v in record.values():
        if isinstance(v, str) and not v.isascii():
            return False
        if isinstance(v, float) and v != 0 and not 1e-3 <= abs(v) < 1e7:
            return False
    return True


# ---- the worker's code, over columns typed as Spark's -------------------------------------
# Arrow type per format, as Spark hands columns over.
ARROW = {"string": pa.string(), "long": pa.int64(), "int": pa.int32(), "double": pa.float64(), "bytes": pa.binary()}
# Keys (distinct, so each row is its own changelog key) and values: negatives, extremes,
# unicode, empty, -0.0 (other bytes than 0.0), infinities, and NaN as a simple double value.
KEYS: dict[str, list[Any]] = {
    "string": ["alpha", "Ünïcode ✓", "", "日本語", "😀 emoji", "x" * 300, "quo\"te\\", "b"],
    "long": [-(2 ** 63), -5, 0, 7, 2 ** 62, 2 ** 63 - 1, -1, 1],
    "int": [-(2 ** 31), -1, 0, 42, 2 ** 31 - 1, -7, 1, -(2 ** 15)],
    "double": [-2.5, -0.0, 0.0, 1e-300, 1e18, float("inf"), float("-inf"), -1e-7],
    "bytes": [b"", b"\x00", b"\xff\xfe", b"\x80" * 9, b"key", "é".encode(), b"\x00" * 4, b"\x7f"],
}
VALUES: dict[str, list[Any]] = {**KEYS, "double": [float("nan"), -0.0, 0.1, -1e300, float("inf"), 5e-324]}


def _rows(layout: str, key_format: str, value_format: str) -> list[tuple[Any, Any, int | None, int | None]]:
    """(key, value, t1, t2): every key once, the values over and over."""
    keys, values = KEYS[key_format], VALUES[value_format]
    out = []
    for i, key in enumerate(keys):
        start = T0 + (i % 3) * 60_000 if layout != "kv" else None
        end = start + 1000 * i if layout == "session" else None
        out.append((key, values[i % len(values)], start, end))
    return out


def _batches(rows: list[tuple], layout: str, key_format: str, value_format: str) -> Iterator[pa.RecordBatch]:
    """Two Arrow batches, the second a slice (offsets that do not start at zero)."""
    cols = {"k": pa.array([r[0] for r in rows], ARROW[key_format]),
            "v": pa.array([r[1] for r in rows], ARROW[value_format])}
    if layout != "kv":
        cols["t1"] = pa.array([r[2] for r in rows], pa.int64())
    if layout == "session":
        cols["t2"] = pa.array([r[3] for r in rows], pa.int64())
    cols["bad"] = pa.array([False] * len(rows))
    whole = pa.RecordBatch.from_pydict(cols)
    half = len(rows) // 2
    padded = pa.concat_batches([whole.slice(0, 1), whole.slice(half)])  # one row in front, sliced off
    return iter([whole.slice(0, half), padded.slice(1)])


def spec_for(defn: StoreDefinition, value_encoded: bool = False) -> WriteSpec:
    return WriteSpec(bootstrap_servers="fake:9092", topic=defn.topic, partitions=defn.partitions,
                     layout=defn.store_type.changelog_layout, key=defn.key,
                     value=None if value_encoded else defn.value, now_ms=NOW,
                     producer_config=PRODUCER_CONFIG, flush_timeout=5.0)


def check_produced(fake: FakeKafka, defn: StoreDefinition, rows: list[tuple], result: pa.RecordBatch | None) -> None:
    """The records produced are ``rows`` (key, value, t1, t2) in the store's bytes."""
    got = fake.records(defn.topic)
    assert len(got) == len(rows)
    expected = []
    for key, value, t1, t2 in rows:
        ck, plain = expected_key(defn, key, t1, t2)
        expected.append((partition_for(plain, P), ck, expected_time(defn, t1, t2, NOW), value))
    # one record per row: match them by (partition, key, time), then compare the value bytes
    by_key = defaultdict(list)
    for r in got:
        by_key[(r.partition, r.key, r.timestamp)].append(r.value)
    for partition, ck, stamp, value in expected:
        assert by_key.get((partition, ck, stamp)), (f"no record with key {ck!r} in partition {partition} "
                                                    f"at time {stamp}")
        same_value(defn, by_key[(partition, ck, stamp)].pop(), value)
    if result is not None:  # what the task reports: per partition its records and last offset
        reported = {p: (o, n) for p, o, n in zip(*(result.column(c).to_pylist()
                                                 for c in ("partition", "offset", "records")))}
        assert reported == {p: (len(fake.log[(defn.topic, p)]) - 1, len(fake.log[(defn.topic, p)]))
                            for p in range(P) if fake.log[(defn.topic, p)]}


@pytest.mark.parametrize("value_format", SIMPLE)
@pytest.mark.parametrize("key_format", SIMPLE)
@pytest.mark.parametrize("type_", ["kv", "window", "session"])
def test_produced_bytes_are_the_formats_and_the_layouts(fake_kafka, type_, key_format, value_format):
    defn = definition(type_, key_format, value_format)
    layout = defn.store_type.changelog_layout
    rows = _rows(layout, key_format, value_format)
    result = produce_batches(spec_for(defn), _batches(rows, layout, key_format, value_format))
    check_produced(fake_kafka, defn, rows, result)


@pytest.mark.parametrize("key_format", SIMPLE)
@pytest.mark.parametrize("type_", ["kv", "window", "session"])
def test_tombstones_carry_the_changelog_key_and_no_value(fake_kafka, type_, key_format):
    """Replace mode's and delete_keys' deletes: the changelog key as the layout builds it, a
    null value, in the plain key's partition."""
    defn = definition(type_, key_format, "string")
    layout = defn.store_type.changelog_layout
    rows = _rows(layout, key_format, "string")
    keys = pa.array([r[0] for r in rows], ARROW[key_format])
    t1 = pa.array([r[2] for r in rows], pa.int64()) if layout != "kv" else None
    t2 = pa.array([r[3] for r in rows], pa.int64()) if layout == "session" else None
    changelog = changelog_keys(layout, encode(keys, defn.key), t1, t2).to_pylist()
    assert changelog == [expected_key(defn, k, s, e)[0] for k, _, s, e in rows]
    assert [plain_key(layout, k) for k in changelog] == [defn.key.serialize(k) for k, *_ in rows]
    offsets = tombstones("fake:9092", defn, changelog, NOW, 5.0)
    got = fake_kafka.records(defn.topic)
    assert sorted((r.partition, r.key, r.value, r.timestamp) for r in got) == sorted(
        (partition_for(defn.key.serialize(k), P), ck, None, NOW) for k, ck in zip(keys.to_pylist(), changelog))
    assert offsets == {p: len(fake_kafka.log[(defn.topic, p)]) - 1 for p in range(P) if fake_kafka.log[(defn.topic, p)]}


def test_a_key_or_value_that_is_null_is_not_encoded():
    """The sink's checks keep nulls out of pass 2; should one get there, it fails, it is not
    written as some other key."""
    from federator.formats import FormatError

    for name in SIMPLE:
        with pytest.raises(FormatError, match="null"):
            encode(pa.array([KEYS[name][0], None], ARROW[name]), REGISTRY.format(name))


def test_nan_and_infinities_keep_their_bytes():
    """The simple double format writes IEEE 754 bits as they are (not a canonical NaN of
    another sign or payload than the format's serialize)."""
    fmt = REGISTRY.format("double")
    values = [float("nan"), float("inf"), float("-inf"), -0.0]
    got = encode(pa.array(values, pa.float64()), fmt).to_pylist()
    assert got == [fmt.serialize(v) for v in values]
    assert math.isnan(fmt.deserialize(got[0]))


# ---- Spark's own columns --------------------------------------------------------------------
# conftest's world stores: (rows, how a row reads as (key, value, t1, t2)).
WORLD = {
    "rt_string": (STRING_ROWS, lambda r: (r[0], r[1], None, None)),
    "rt_long": (LONG_ROWS, lambda r: (r[0], r[1], None, None)),
    "rt_int": (INT_ROWS, lambda r: (r[0], r[1], None, None)),
    "rt_double": (DOUBLE_ROWS, lambda r: (r[0], r[1], None, None)),
    "rt_bytes": (BYTES_ROWS, lambda r: (r[0], r[1], None, None)),
    "rt_json": (JSON_ROWS, lambda r: (r[0], dict(zip(["team", "score", "level", "ratio", "active", "seen"], r[1:])),
                                      None, None)),
    "rt_window": (WINDOW_ROWS, lambda r: (r[0], r[2], r[1], None)),
    "rt_session": (SESSION_ROWS, lambda r: (r[0], {"games": r[3], "label": r[4]}, r[1], r[2])),
}


@pytest.fixture(scope="module")
def world_frames(spark) -> dict[str, Any]:
    return frames(spark)


def plan_of(world_frames: dict[str, Any], name: str) -> Plan:
    df, kw = world_frames[name]
    return plan(df, name, partitions=P, topic=f"{name}-changelog", registry=REGISTRY,
                **{"value": None, "type": "kv", "window_start": None, "window_size_ms": None,
                   "session_start": None, "session_end": None, **kw})


def test_the_world_covers_every_built_in(world_frames):
    stores = {name: plan_of(world_frames, name).defn for name in WORLD}
    # every built-in type's changelog layout (a versioned store's records are laid out as kv's)
    layouts = {REGISTRY.store_type(t).changelog_layout for t in STORE_TYPES}
    assert {d.store_type.changelog_layout for d in stores.values()} == layouts == {"kv", "window", "session"}
    assert {d.key_format for d in stores.values()} | {d.value_format for d in stores.values()} == set(FORMATS)


@pytest.mark.parametrize("name", list(WORLD))
def test_spark_columns_are_written_as_the_formats_serialize(world_frames, fake_kafka, name):
    """The write's plan over the world's DataFrames (Spark picks the Arrow types, to_json builds
    the JSON documents), through the worker's code."""
    the_plan = plan_of(world_frames, name)
    df, _ = world_frames[name]
    rows = df.select(*the_plan.projection, *the_plan.extra)
    write_columns = [c for c in ("k", "v", "t1", "t2") if c in rows.columns]
    table = rows.select(*write_columns, failing(the_plan).alias("bad")).toArrow()
    result = produce_batches(spec_for(the_plan.defn, the_plan.value_encoded), iter(table.to_batches()))
    data, as_row = WORLD[name]
    check_produced(fake_kafka, the_plan.defn, [as_row(r) for r in data], result)


@pytest.mark.parametrize("name", ["rt_string", "rt_double", "rt_window", "rt_session"])
def test_delete_keys_tombstones_the_changelog_keys(world_frames, fake_kafka, monkeypatch, name):
    """delete_keys (Spark collects the rows to the driver) against a stand-in catalog."""
    defn = plan_of(world_frames, name).defn

    class OneStore:
        def __init__(self, *args: Any) -> None:
            pass

        def load(self) -> dict[str, StoreDefinition]:
            return {name: defn}

    monkeypatch.setattr(write, "Catalog", OneStore)
    df, kw = world_frames[name]
    times = {k: v for k, v in kw.items() if k in ("window_start", "session_start", "session_end")}
    write.delete_keys(df, name, key=kw["key"], bootstrap_servers="fake:9092", application_id="app",
                      registry=REGISTRY, **times)
    data, as_row = WORLD[name]
    expected = [(partition_for(plain, P), ck, None)
                for ck, plain in (expected_key(defn, k, t1, t2) for k, _, t1, t2 in map(as_row, data))]
    got = fake_kafka.records(defn.topic)
    assert len({r.timestamp for r in got}) == 1  # one time: the delete's
    assert sorted((r.partition, r.key, r.value) for r in got) == sorted(expected)


# ---- what write_store wrote to the broker ---------------------------------------------------
@pytest.mark.integration
@pytest.mark.parametrize("name", list(WORLD))
def test_changelogs_hold_the_formats_bytes(world, name):
    """Each world store's changelog, as write_store produced it (re-runs of the same write add
    the same records again): every record is a row of the DataFrame in the store's bytes."""
    defn = Catalog(world.bootstrap, world.app, REGISTRY).get(name)
    data, as_row = WORLD[name]
    expected: dict[tuple[int, bytes], Any] = {}
    for key, value, t1, t2 in map(as_row, data):
        ck, plain = expected_key(defn, key, t1, t2)
        expected[(partition_for(plain, P), ck)] = (value, expected_time(defn, t1, t2, None))
    seen = set()
    for p in range(P):
        for _, key, value, stamp in read_partition(world, defn.topic, p):
            assert (p, key) in expected, f"unexpected key {key!r} in partition {p}"
            want, want_time = expected[(p, key)]
            assert value is not None
            same_value(defn, value, want)
            assert want_time is None or stamp == want_time
            seen.add((p, key))
    assert seen == set(expected)

