"""Shards on real RocksDB: applying changelog records, answering queries, positions, failures."""

from __future__ import annotations

import datetime as dt
import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterator

import pyarrow as pa
import pytest

from federator.catalog import StoreDefinition
from federator.formats import TIMESTAMP
from federator.query import (
    FailureReason,
    KeyQuery,
    Position,
    PositionBound,
    Query,
    RangeQuery,
    SessionQuery,
    WindowKeyQuery,
    WindowRangeQuery,
)
from federator.store import ChangelogRecord, Shard, UnsupportedQuery
from federator.store.layout import session_key, window_key
from tests.registry import REGISTRY

TOPIC = "app-s-changelog"
UTC = dt.timezone.utc


def definition(
    type: str = "kv",
    key_format: str = "string",
    value: dict | None = None,
    window_size_ms: int | None = None,
    **extra: Any,
) -> StoreDefinition:
    d: dict[str, Any] = {
        "name": "s",
        "type": type,
        "topic": TOPIC,
        "partitions": 4,
        "key": {"name": "k", "format": key_format},
        "value": value or {"format": "string", "name": "v"},
        **extra,
    }
    if type == "window":
        d["window_size_ms"] = window_size_ms or 10
    return StoreDefinition.from_dict(d, REGISTRY)


def json_value(*fields: tuple[str, str]) -> dict:
    return {"format": "json", "fields": [{"name": n, "type": t} for n, t in fields]}


def ms(t: int) -> dt.datetime:
    return dt.datetime(1970, 1, 1, tzinfo=UTC) + dt.timedelta(milliseconds=t)


class Records:
    """Changelog records with increasing offsets."""

    def __init__(self) -> None:
        self.offset = -1

    def __call__(self, key: bytes, value: bytes | None, timestamp: int = 1_000) -> ChangelogRecord:
        self.offset += 1
        return ChangelogRecord(key, value, self.offset, timestamp)


@pytest.fixture
def rec() -> Records:
    return Records()


@pytest.fixture
def open_shard(tmp_path: Path) -> Iterator[Callable[..., Shard]]:
    """open_shard(defn, name="shard", partition=1): shards are closed at the end of the test."""
    opened: list[Shard] = []

    def _open(defn: StoreDefinition, name: str = "shard", partition: int = 1) -> Shard:
        s = Shard(tmp_path / name, defn, partition)
        opened.append(s)
        return s

    yield _open
    for s in opened:
        try:
            s.close()
        except Exception:
            pass


def ok(shard: Shard, q: Query, bound: PositionBound = PositionBound.unbounded()) -> list[dict]:
    r = shard.run(q, bound)
    assert r.ok, f"{r.failure}: {r.message}"
    assert r.partition == shard.partition
    assert r.batch.schema == shard.schema
    return r.batch.to_pylist()


def col(rows: list[dict], name: str) -> list:
    return [r[name] for r in rows]


# ---- key-value stores -----------------------------------------------------------------------------


def test_kv_apply_then_key_and_range_queries(open_shard, rec) -> None:
    shard = open_shard(definition())
    shard.apply([rec(b"b", b"two", 2_000), rec(b"a", b"one", 1_000), rec(b"c", b"three", 3_000)])

    assert ok(shard, KeyQuery("a")) == [{"k": "a", "v": "one", "rowtime": ms(1_000)}]
    rows = ok(shard, RangeQuery())
    assert col(rows, "k") == ["a", "b", "c"]
    assert col(rows, "v") == ["one", "two", "three"]
    assert col(rows, "rowtime") == [ms(1_000), ms(2_000), ms(3_000)]
    assert col(ok(shard, RangeQuery(lower="b")), "k") == ["b", "c"]
    assert col(ok(shard, RangeQuery(upper="b", upper_inclusive=False, descending=True)), "k") == ["a"]
    assert col(ok(shard, RangeQuery(descending=True)), "k") == ["c", "b", "a"]


@pytest.mark.parametrize("populated", [False, True])
def test_key_query_for_a_missing_key_is_empty(open_shard, rec, populated: bool) -> None:
    shard = open_shard(definition())
    if populated:
        shard.apply([rec(b"a", b"1"), rec(b"c", b"3")])
    r = shard.run(KeyQuery("b"))
    assert r.ok, f"{r.failure}: {r.message}"
    assert r.batch.num_rows == 0
    assert r.batch.schema == shard.schema


def test_kv_later_records_overwrite(open_shard, rec) -> None:
    shard = open_shard(definition())
    shard.apply([rec(b"a", b"one", 1_000)])
    shard.apply([rec(b"a", b"uno", 5_000), rec(b"a", b"eins", 6_000)])
    assert ok(shard, KeyQuery("a")) == [{"k": "a", "v": "eins", "rowtime": ms(6_000)}]


def test_tombstones_delete(open_shard, rec) -> None:
    shard = open_shard(definition())
    shard.apply([rec(b"a", b"1"), rec(b"b", b"2"), rec(b"c", b"3")])
    shard.apply([rec(b"b", None)])
    assert col(ok(shard, RangeQuery()), "k") == ["a", "c"]
    # within one batch, the last record for a key wins
    shard.apply([rec(b"a", None), rec(b"c", b"33"), rec(b"c", None), rec(b"d", None), rec(b"e", b"5"), rec(b"e", None), rec(b"e", b"55")])
    rows = ok(shard, RangeQuery())
    assert [(r["k"], r["v"]) for r in rows] == [("e", "55")]
    # a tombstone for a key that never existed is harmless and still moves the position
    shard.apply([rec(b"nope", None)])
    assert shard.offset == rec.offset
    assert ok(shard, KeyQuery("e")) == [{"k": "e", "v": "55", "rowtime": ms(1_000)}]
    assert ok(shard, KeyQuery("b")) == []  # deleted


def test_json_value_columns(open_shard, rec) -> None:
    defn = definition(key_format="long", value=json_value(("name", "string"), ("score", "long"), ("seen", "timestamp"), ("vip", "boolean")))
    shard = open_shard(defn)
    assert shard.schema.names == ["k", "name", "score", "seen", "vip", "rowtime"]
    assert shard.schema.field("seen").type == TIMESTAMP
    key = defn.key.serialize
    shard.apply(
        [
            rec(key(2), json.dumps({"name": "bo", "score": 7, "seen": "2024-01-01T00:00:00Z", "vip": True}).encode(), 10),
            rec(key(-1), b'{"name": "al"}', 20),
        ]
    )
    rows = ok(shard, RangeQuery())
    assert rows == [
        {"k": -1, "name": "al", "score": None, "seen": None, "vip": None, "rowtime": ms(20)},
        {"k": 2, "name": "bo", "score": 7, "seen": dt.datetime(2024, 1, 1, tzinfo=UTC), "vip": True, "rowtime": ms(10)},
    ]
    assert ok(shard, KeyQuery(2))[0]["score"] == 7


@pytest.mark.parametrize(
    ("value_format", "value", "expected"),
    [
        ("long", struct.pack(">q", -5), -5),
        ("int", struct.pack(">i", 1 << 30), 1 << 30),
        ("double", struct.pack(">d", 2.5), 2.5),
        ("bytes", b"\x00\xff", b"\x00\xff"),
        ("string", "é".encode(), "é"),
    ],
)
def test_value_formats(open_shard, rec, value_format: str, value: bytes, expected: Any) -> None:
    shard = open_shard(definition(value={"format": value_format, "name": "v"}))
    shard.apply([rec(b"k", value, 123)])
    assert ok(shard, KeyQuery("k")) == [{"k": "k", "v": expected, "rowtime": ms(123)}]


def test_rowtime_column_is_record_timestamp(open_shard, rec) -> None:
    shard = open_shard(definition())
    ts = 1_700_000_000_123
    shard.apply([rec(b"a", b"x", ts), rec(b"b", b"y", 0)])
    r = shard.run(RangeQuery())
    assert r.batch.schema.field("rowtime").type == pa.timestamp("ms", tz="UTC")
    assert r.batch.column("rowtime").cast(pa.int64()).to_pylist() == [ts, 0]


def test_many_string_values(open_shard, rec) -> None:
    # more than 64 values: the string decoder's bulk path
    shard = open_shard(definition())
    shard.apply([rec(f"k{i:03}".encode(), f"v{i}é".encode()) for i in range(150)])
    rows = ok(shard, RangeQuery())
    assert col(rows, "v") == [f"v{i}é" for i in range(150)]


# ---- positions -----------------------------------------------------------------------------------


def test_position_follows_applied_offsets(open_shard, rec) -> None:
    shard = open_shard(definition(), partition=3)
    assert shard.offset is None
    assert shard.position.is_empty()
    shard.apply([])
    assert shard.offset is None
    shard.apply([rec(b"a", b"1"), rec(b"b", b"2")])
    assert shard.offset == 1
    assert shard.position == Position.of(TOPIC, 3, 1)
    r = shard.run(KeyQuery("a"))
    assert r.position == Position.of(TOPIC, 3, 1)
    assert shard.query(KeyQuery("a"))[1] == Position.of(TOPIC, 3, 1)


def test_position_and_data_persist_across_close_and_reopen(open_shard, rec) -> None:
    defn = definition()
    shard = open_shard(defn, name="p", partition=2)
    shard.apply([rec(b"a", b"1"), rec(b"b", b"2")])
    shard.apply([rec(b"a", None)])
    shard.close()

    again = open_shard(defn, name="p", partition=2)
    assert again.offset == 2
    assert again.position == Position.of(TOPIC, 2, 2)
    assert [(r["k"], r["v"]) for r in ok(again, RangeQuery())] == [("b", "2")]


def test_reset_empties_data_and_position(open_shard, rec) -> None:
    defn = definition(key_format="bytes")
    shard = open_shard(defn, name="r")
    shard.apply([rec(bytes([i]) + b"key", b"v") for i in range(256)] + [rec(b"\xff" * 40, b"last"), rec(b"", b"empty")])
    assert len(ok(shard, RangeQuery())) == 258
    shard.reset()
    assert ok(shard, RangeQuery()) == []
    assert shard.offset is None and shard.position.is_empty()
    # and it stays empty on disk
    shard.close()
    again = open_shard(defn, name="r")
    assert ok(again, RangeQuery()) == []
    assert again.offset is None
    # a reset shard takes new records
    again.apply([ChangelogRecord(b"new", b"v", 0, 1)])
    assert col(ok(again, RangeQuery()), "k") == [b"new"]
    assert again.offset == 0
    assert ok(again, KeyQuery(b"")) == []  # the empty key is gone too


def test_reset_of_an_empty_shard(open_shard) -> None:
    shard = open_shard(definition())
    shard.reset()
    assert ok(shard, RangeQuery()) == [] and shard.offset is None


def test_failed_apply_changes_nothing(open_shard, rec, monkeypatch: pytest.MonkeyPatch) -> None:
    defn = definition()
    shard = open_shard(defn, name="atomic")
    shard.apply([rec(b"a", b"1"), rec(b"b", b"2")])
    before_rows, before_pos = ok(shard, RangeQuery()), shard.position

    def half_then_fail(wb, records, view) -> None:
        for r in list(records)[:2]:
            wb.put(r.key, struct.pack(">q", r.timestamp) + (r.value or b""))
        wb.delete(b"a")
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(shard.store_type, "apply", half_then_fail)
    with pytest.raises(RuntimeError, match="disk on fire"):
        shard.apply([rec(b"x", b"9"), rec(b"y", b"9"), rec(b"z", b"9")])
    monkeypatch.undo()

    assert ok(shard, RangeQuery()) == before_rows
    assert shard.position == before_pos and shard.offset == 1
    shard.close()
    again = open_shard(defn, name="atomic")
    assert ok(again, RangeQuery()) == before_rows
    assert again.position == before_pos
    # and the shard still works
    again.apply([ChangelogRecord(b"c", b"3", 5, 1)])
    assert col(ok(again, RangeQuery()), "k") == ["a", "b", "c"] and again.offset == 5


def racing(shard: Shard, rec: Records, monkeypatch, writes: int, waited: int):
    """Make the first ``writes`` RangeQuery reads of ``shard`` each start a writer applying one
    record while they read; the first ``waited`` of them wait inside the read for that write to
    land (5 s at most), so a write the read holds off fails the test. Returns the writers."""
    from federator.store.kv import KeyValueStoreType
    from tests.threads import Worker

    real = shard.store_type.handler_for(RangeQuery())
    writers: list[Worker] = []

    def read(view, q):
        first = view.get(b"a")
        if len(writers) < writes:  # a writer slips in while this read is under way
            r = rec(b"a", str(rec.offset + 1).encode())  # the value is the offset that wrote it
            w = Worker(shard.apply, [r], name=f"write {r.offset}")
            writers.append(w)
            w.start()
            if len(writers) <= waited:
                w.join_checked(5)  # the write lands while this read is still under way
        batch = real(view, q)
        assert first is not None
        return batch

    racer = KeyValueStoreType().with_handlers({RangeQuery: read})
    monkeypatch.setattr(shard, "store_type", racer)
    return writers


@pytest.mark.parametrize("racing_writes", [1, 2, 3])
def test_a_read_does_not_hold_up_a_write_and_answers_with_the_position_its_data_reflects(
        open_shard, rec, monkeypatch, racing_writes) -> None:
    """Reads do not block materialization: a write that starts during a read lands while the
    read is still under way (the read then notices it and reads again, up to 3 times), and the
    answer carries exactly the position its data reflects."""
    shard = open_shard(definition())
    shard.apply([rec(b"a", b"0")])
    writers = racing(shard, rec, monkeypatch, racing_writes, waited=racing_writes)
    batch, position = shard.query(RangeQuery())
    assert len(writers) == racing_writes
    assert batch.column("v").to_pylist() == [str(position.get(TOPIC, 1))] == [str(racing_writes)]
    assert shard.offset == racing_writes


def test_a_read_overlapped_on_every_try_holds_writes_off_once_and_stays_exact(open_shard, rec, monkeypatch) -> None:
    """After 3 tries that writes overlapped, a read holds writers off for its last try rather
    than retry without end; its answer is still exact, and the held write lands after it."""
    from tests.threads import join_all

    shard = open_shard(definition())
    shard.apply([rec(b"a", b"0")])
    writers = racing(shard, rec, monkeypatch, 4, waited=3)  # the 4th write is started under the lock
    batch, position = shard.query(RangeQuery())
    assert batch.column("v").to_pylist() == [str(position.get(TOPIC, 1))] == ["3"]
    join_all(writers, 10)
    assert len(writers) == 4 and shard.offset == 4


# ---- failures ------------------------------------------------------------------------------------


def test_not_up_to_bound(open_shard, rec) -> None:
    shard = open_shard(definition(), partition=1)
    r = shard.run(KeyQuery("a"), PositionBound.at(Position.of(TOPIC, 1, 0)))
    assert r.failure is FailureReason.NOT_UP_TO_BOUND and not r.ok and r.batch is None

    shard.apply([rec(b"a", b"1") for _ in range(5)])  # offsets 0..4
    ahead = shard.run(KeyQuery("a"), PositionBound.at(Position.of(TOPIC, 1, 5)))
    assert ahead.failure is FailureReason.NOT_UP_TO_BOUND
    assert ahead.partition == 1
    assert "offset 4" in ahead.message and "5" in ahead.message

    assert ok(shard, KeyQuery("a"), PositionBound.at(Position.of(TOPIC, 1, 4)))
    assert ok(shard, KeyQuery("a"), PositionBound.at(Position.of(TOPIC, 1, 0)))
    # other partitions' and other topics' entries don't hold this one back
    assert ok(shard, KeyQuery("a"), PositionBound.at(Position({TOPIC: {0: 100, 1: 3}, "other": {1: 100}})))


@pytest.mark.parametrize(
    ("type", "query"),
    [
        ("kv", WindowKeyQuery("a")),
        ("kv", SessionQuery("a")),
        ("kv", WindowRangeQuery()),
        ("window", KeyQuery("a")),
        ("window", SessionQuery("a")),
        ("session", WindowKeyQuery("a")),
        ("session", RangeQuery()),
    ],
)
def test_unknown_query_type_for_the_store_type(open_shard, rec, type: str, query: Query) -> None:
    shard = open_shard(definition(type=type))
    r = shard.run(query)
    assert r.failure is FailureReason.UNKNOWN_QUERY_TYPE
    assert query.type_name in r.message and repr(type) in r.message
    with pytest.raises(UnsupportedQuery):
        shard.query(query)


def test_unknown_plugin_query(open_shard) -> None:
    @dataclass(frozen=True)
    class CountQuery(Query):
        type_name: ClassVar[str] = "CountQuery"

    r = open_shard(definition()).run(CountQuery())
    assert r.failure is FailureReason.UNKNOWN_QUERY_TYPE and "CountQuery" in r.message


@pytest.mark.parametrize("query", [KeyQuery("k"), RangeQuery()])
def test_store_exception_for_undecodable_bytes(open_shard, rec, query: Query) -> None:
    shard = open_shard(definition(value={"format": "long", "name": "v"}))
    shard.apply([rec(b"k", b"abc")])  # 3 bytes in a long store
    r = shard.run(query)
    assert r.failure is FailureReason.STORE_EXCEPTION
    assert "FormatError" in r.message and "'s'" in r.message


def test_store_exception_for_bad_json(open_shard, rec) -> None:
    shard = open_shard(definition(value=json_value(("n", "long"))))
    shard.apply([rec(b"k", b"{broken")])
    r = shard.run(KeyQuery("k"))
    assert r.failure is FailureReason.STORE_EXCEPTION and "JSON" in r.message


def test_store_exception_for_key_of_the_wrong_type(open_shard) -> None:
    shard = open_shard(definition(key_format="long"))
    r = shard.run(KeyQuery("not a number"))
    assert r.failure is FailureReason.STORE_EXCEPTION and "long format" in r.message


@pytest.mark.parametrize("query", [KeyQuery("a"), RangeQuery()])
def test_a_closed_shard_is_not_present_not_a_store_exception(open_shard, rec, query: Query) -> None:
    # a rebalance closes the shard of a partition that leaves the node while queries still hold it
    shard = open_shard(definition())
    shard.apply([rec(b"a", b"1")])
    shard.close()
    r = shard.run(query)
    assert r.failure is FailureReason.NOT_PRESENT, r
    assert "closed" in r.message and "rebalance" in r.message
    assert shard.run(query, collect_execution_info=True).failure is FailureReason.NOT_PRESENT


def test_a_shard_closed_while_a_query_reads_it_is_not_present(open_shard, rec, monkeypatch) -> None:
    shard = open_shard(definition())
    shard.apply([rec(b"a", b"1")])
    read = shard.store_type.handler_for(RangeQuery())

    def closed_midway(view, query):
        shard.close()
        return read(view, query)  # rocksdict raises its DbClosedError here

    monkeypatch.setattr(shard.store_type, "handler_for", lambda q: closed_midway)
    r = shard.run(RangeQuery())
    assert r.failure is FailureReason.NOT_PRESENT, r


# ---- redefinition ---------------------------------------------------------------------------------


def test_reopen_with_changed_definition_wipes(open_shard, rec) -> None:
    old = definition()
    shard = open_shard(old, name="d")
    shard.apply([rec(b"a", b"1"), rec(b"b", b"2")])
    shard.close()

    new = definition(value={"format": "string", "name": "label"})
    changed = open_shard(new, name="d")
    assert ok(changed, RangeQuery()) == []
    assert changed.offset is None and changed.position.is_empty()
    changed.apply([ChangelogRecord(b"c", b"3", 0, 7)])
    changed.close()

    # the new definition is what is on disk now: reopening with it keeps the data
    same = open_shard(new, name="d")
    assert ok(same, RangeQuery()) == [{"k": "c", "label": "3", "rowtime": ms(7)}]
    assert same.offset == 0


def test_reopen_with_same_definition_keeps_data(open_shard, rec) -> None:
    shard = open_shard(definition(), name="d")
    shard.apply([rec(b"a", b"1")])
    shard.close()
    again = open_shard(definition(), name="d")  # equal, not identical
    assert col(ok(again, RangeQuery()), "k") == ["a"]


@pytest.mark.parametrize(
    "change",
    [
        {"topic": "other-topic"},
        {"partitions": 8},
        {"key_format": "bytes"},
        {"value": {"format": "bytes", "name": "v"}},
    ],
)
def test_any_definition_change_wipes(open_shard, rec, change: dict) -> None:
    shard = open_shard(definition(), name="d")
    shard.apply([rec(b"a", b"1")])
    shard.close()
    kwargs: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for k, v in change.items():
        (kwargs if k in ("key_format", "value") else extra)[k] = v
    d = definition(**kwargs).to_dict()
    d.update(extra)
    again = open_shard(StoreDefinition.from_dict(d, REGISTRY), name="d")
    assert again.run(RangeQuery()).batch.num_rows == 0
    assert again.offset is None


# ---- window stores --------------------------------------------------------------------------------

WINDOW_SIZE = 10
WINDOW_STARTS = [0, 10, 20, 30, 1_000]


@pytest.fixture
def window_shard(open_shard, rec) -> Shard:
    shard = open_shard(definition(type="window", window_size_ms=WINDOW_SIZE), name="w")
    records = []
    for key in (b"a", b"ab", b"a\x00", b"b", b""):
        for start in WINDOW_STARTS:
            records.append(rec(window_key(key, start), f"{key.decode()}@{start}".encode(), start + 1))
    shard.apply(records)
    return shard


def test_window_schema(window_shard: Shard) -> None:
    assert window_shard.schema.names == ["k", "window_start", "window_end", "v", "rowtime"]
    assert window_shard.schema.field("window_start").type == TIMESTAMP


@pytest.mark.parametrize(
    ("time_from", "time_to"),
    [(None, None), (10, 20), (11, 20), (10, 19), (0, 0), (None, 15), (25, None), (31, 999), (1_000, 1_000), (5_000, None), (20, 10)],
)
@pytest.mark.parametrize("key", ["a", "ab", "a\x00", ""])
def test_window_key_query(window_shard: Shard, key: str, time_from: int | None, time_to: int | None) -> None:
    rows = ok(window_shard, WindowKeyQuery(key, time_from, time_to))
    want = [s for s in WINDOW_STARTS if (time_from is None or s >= time_from) and (time_to is None or s <= time_to)]
    assert col(rows, "window_start") == [ms(s) for s in want]  # in start order
    assert col(rows, "window_end") == [ms(s + WINDOW_SIZE) for s in want]
    assert col(rows, "k") == [key] * len(want)  # no longer key sharing the prefix leaks in
    assert col(rows, "v") == [f"{key}@{s}" for s in want]
    assert col(rows, "rowtime") == [ms(s + 1) for s in want]


@pytest.mark.parametrize(("time_from", "time_to"), [(None, -1), (-100, -1), (None, -10**12)])
def test_window_key_query_before_every_window(window_shard: Shard, time_from: int | None, time_to: int) -> None:
    # every window starts at or after 0, so none starts at or before a negative time_to
    assert ok(window_shard, WindowKeyQuery("a", time_from, time_to)) == []


def test_window_key_query_unknown_key(window_shard: Shard) -> None:
    assert ok(window_shard, WindowKeyQuery("zz")) == []
    assert ok(window_shard, WindowKeyQuery("a\x00\x00")) == []


@pytest.mark.parametrize(("time_from", "time_to"), [(None, None), (10, 20), (15, 25), (None, -1), (1_000, None), (21, 29)])
def test_window_range_query(window_shard: Shard, time_from: int | None, time_to: int | None) -> None:
    rows = ok(window_shard, WindowRangeQuery(time_from, time_to))
    got = sorted((r["k"], r["window_start"], r["window_end"], r["v"]) for r in rows)
    want = sorted(
        (k, ms(s), ms(s + WINDOW_SIZE), f"{k}@{s}")
        for k in ("a", "ab", "a\x00", "b", "")
        for s in WINDOW_STARTS
        if (time_from is None or s >= time_from) and (time_to is None or s <= time_to)
    )
    assert got == want


def test_window_store_with_long_keys_and_json(open_shard, rec) -> None:
    defn = definition(type="window", key_format="long", value=json_value(("n", "int")), window_size_ms=60_000)
    shard = open_shard(defn)
    kb = defn.key.serialize
    shard.apply([rec(window_key(kb(-1), 60_000), b'{"n": 1}'), rec(window_key(kb(1), 0), b'{"n": 2}'), rec(window_key(kb(1), 60_000), b"{}")])
    rows = ok(shard, WindowKeyQuery(1))
    assert [(r["k"], r["window_start"], r["window_end"], r["n"]) for r in rows] == [
        (1, ms(0), ms(60_000), 2),
        (1, ms(60_000), ms(120_000), None),
    ]
    assert sorted(col(ok(shard, WindowRangeQuery(60_000, 60_000)), "k")) == [-1, 1]


def test_window_tombstone(window_shard: Shard, rec) -> None:
    rec.offset = window_shard.offset
    window_shard.apply([rec(window_key(b"a", 10), None)])
    assert col(ok(window_shard, WindowKeyQuery("a", 0, 20)), "window_start") == [ms(0), ms(20)]


# ---- session stores -------------------------------------------------------------------------------

SESSIONS = {
    b"a": [(0, 10), (20, 30), (40, 50), (55, 55)],
    b"ab": [(0, 100)],
    b"a\x00": [(12, 18)],
    b"b": [(5, 15), (60, 70)],
}


@pytest.fixture
def session_shard(open_shard, rec) -> Shard:
    shard = open_shard(definition(type="session"), name="sess")
    records = [
        rec(session_key(k, s, e), f"{k.decode()}:{s}-{e}".encode(), e)
        for k, sessions in SESSIONS.items()
        for s, e in sessions
    ]
    shard.apply(records)
    return shard


def overlapping(key: bytes, lo: int | None, hi: int | None) -> list[tuple[int, int]]:
    return [(s, e) for s, e in SESSIONS[key] if (lo is None or e >= lo) and (hi is None or s <= hi)]


@pytest.mark.parametrize(
    ("time_from", "time_to"),
    [(None, None), (25, 45), (10, 10), (11, 19), (50, 55), (51, 54), (None, 0), (56, None), (30, 20), (0, 100), (-5, -1)],
)
@pytest.mark.parametrize("key", [b"a", b"ab", b"a\x00", b"b"])
def test_session_query_overlap(session_shard: Shard, key: bytes, time_from: int | None, time_to: int | None) -> None:
    rows = ok(session_shard, SessionQuery(key.decode(), time_from, time_to))
    want = sorted(overlapping(key, time_from, time_to), key=lambda se: (se[1], se[0]))  # ordered by end
    assert [(r["window_start"], r["window_end"]) for r in rows] == [(ms(s), ms(e)) for s, e in want]
    assert col(rows, "k") == [key.decode()] * len(want)
    assert col(rows, "v") == [f"{key.decode()}:{s}-{e}" for s, e in want]
    assert col(rows, "rowtime") == [ms(e) for s, e in want]


@pytest.mark.parametrize(("time_from", "time_to"), [(None, None), (12, 22), (51, 54), (101, None), (None, -1)])
def test_session_window_range_query(session_shard: Shard, time_from: int | None, time_to: int | None) -> None:
    rows = ok(session_shard, WindowRangeQuery(time_from, time_to))
    got = sorted((r["k"], r["window_start"], r["window_end"]) for r in rows)
    want = sorted((k.decode(), ms(s), ms(e)) for k in SESSIONS for s, e in overlapping(k, time_from, time_to))
    assert got == want


def test_session_merge_replaces_old_sessions(session_shard: Shard, rec) -> None:
    # Kafka merges sessions by deleting the old ones and writing the merged one
    rec.offset = session_shard.offset
    session_shard.apply(
        [rec(session_key(b"a", 0, 10), None), rec(session_key(b"a", 20, 30), None), rec(session_key(b"a", 0, 30), b"merged", 30)]
    )
    rows = ok(session_shard, SessionQuery("a", None, 35))
    assert [(r["window_start"], r["window_end"], r["v"]) for r in rows] == [(ms(0), ms(30), "merged")]


# ---- schemas ---------------------------------------------------------------------------------------

VALUE_SPECS = [
    ({"format": "string", "name": "v"}, lambda i: f"s{i}".encode()),
    ({"format": "bytes", "name": "v"}, lambda i: bytes([i % 256])),
    ({"format": "long", "name": "v"}, lambda i: struct.pack(">q", i)),
    ({"format": "int", "name": "v"}, lambda i: struct.pack(">i", i)),
    ({"format": "double", "name": "v"}, lambda i: struct.pack(">d", i / 2)),
    (json_value(("a", "string"), ("b", "long"), ("c", "int"), ("d", "double"), ("e", "boolean"), ("f", "timestamp")), lambda i: b'{"b": 1}'),
]
QUERIES = {
    "kv": [KeyQuery, RangeQuery],
    "window": [WindowKeyQuery, WindowRangeQuery],
    "session": [SessionQuery, WindowRangeQuery],
}


def sample_key(key_format: str) -> Any:
    return {"string": "k1", "bytes": b"k1", "long": 1, "int": 1, "double": 1.0}[key_format]


@pytest.mark.parametrize("type", ["kv", "window", "session"])
@pytest.mark.parametrize("key_format", ["string", "bytes", "long", "int", "double"])
@pytest.mark.parametrize("spec", range(len(VALUE_SPECS)))
def test_result_schema_is_shard_schema_even_when_empty(open_shard, rec, type: str, key_format: str, spec: int) -> None:
    value, encode = VALUE_SPECS[spec]
    defn = definition(type=type, key_format=key_format, value=value)
    shard = open_shard(defn)
    assert shard.schema == defn.arrow_schema()
    key = sample_key(key_format)

    def run_all(expect_rows: bool) -> None:
        for qcls in QUERIES[type]:
            if qcls is KeyQuery and not expect_rows:
                continue  # a KeyQuery for a missing key: test_key_query_for_a_missing_key_is_empty
            q = qcls(key) if qcls in (KeyQuery, WindowKeyQuery, SessionQuery) else qcls()
            r = shard.run(q)
            assert r.ok, r.message
            assert r.batch.schema == shard.schema
            assert (r.batch.num_rows > 0) is expect_rows

    run_all(False)
    kb = defn.key.serialize(key)
    layout = {"kv": lambda: kb, "window": lambda: window_key(kb, 0), "session": lambda: session_key(kb, 0, 5)}[type]
    shard.apply([rec(layout(), encode(3))])
    run_all(True)
    # a key that is not there: empty again, same schema
    other = {"string": "zz", "bytes": b"zz", "long": 99, "int": 99, "double": 9.5}[key_format]
    for qcls in QUERIES[type]:
        if qcls in (WindowKeyQuery, SessionQuery):
            r = shard.run(qcls(other))
            assert r.ok and r.batch.num_rows == 0 and r.batch.schema == shard.schema


def test_execution_info_is_collected_only_when_asked(open_shard, rec) -> None:
    shard = open_shard(definition())
    shard.apply([rec(b"a", b"1"), rec(b"b", b"2")])
    assert shard.run(RangeQuery()).execution_info == []
    info = shard.run(RangeQuery(), collect_execution_info=True).execution_info
    assert len(info) == 1 and "RangeQuery ok, 2 rows" in info[0] and "partition 1" in info[0] and "offset 1" in info[0]


def test_full_scans_are_reused_until_the_shard_changes(tmp_path) -> None:
    from federator.store.scan_cache import CachingLayer, ScanCache

    cache = ScanCache(256 << 20)
    shard = CachingLayer(Shard(tmp_path / "s", definition(), 0), cache)

    def query(q: Query) -> tuple[pa.RecordBatch, Position]:
        r = shard.run(q)
        assert r.ok, r.message
        return r.batch, r.position

    shard.apply([ChangelogRecord(b"a", b"1", 0, 1), ChangelogRecord(b"b", b"2", 1, 1)])
    first, pos1 = query(RangeQuery())
    again, _ = query(RangeQuery())
    assert again is first  # the same Arrow batch: no second iteration
    assert query(RangeQuery("a", "a"))[0] is not first  # only whole-shard scans are kept
    shard.apply([ChangelogRecord(b"c", b"3", 2, 1), ChangelogRecord(b"a", None, 3, 1)])
    after, pos2 = query(RangeQuery())
    assert after.column(0).to_pylist() == ["b", "c"] and pos2.get(TOPIC, 0) == 3 and pos1.get(TOPIC, 0) == 1
    shard.reset()
    assert query(RangeQuery())[0].num_rows == 0
    shard.close()
    assert shard.base not in cache._entries


def test_scan_cache_keeps_to_its_budget() -> None:
    from federator.store.scan_cache import ScanCache

    cache = ScanCache(max_bytes=2000)
    batch = pa.record_batch({"x": pa.array(range(100), pa.int64())})  # 800 bytes
    owners = [object() for _ in range(4)]
    for o in owners:
        cache.put(o, 2, batch)
    assert cache.get(owners[0], 2) is None and cache.get(owners[1], 2) is None  # evicted, oldest first
    assert cache.get(owners[3], 2) is batch and cache.get(owners[3], 4) is None  # a newer write: stale
    assert cache.stats()["bytes"] <= 2000
    cache.put(object(), 2, pa.record_batch({"x": pa.array(range(1000), pa.int64())}))  # bigger than the budget
    assert cache.stats()["bytes"] <= 2000


def _counting_duck(tmp_path, calls: list[int]):
    """A DuckDB that notes how many rows each statement an owner runs reads."""
    from federator.owner.duck import Duck, DuckConfig

    class CountingDuck(Duck):
        def over_rows(self, sql, rows, name="rows"):
            calls.append(rows.num_rows)
            return super().over_rows(sql, rows, name)

    return CountingDuck(DuckConfig(memory_limit="100MB", spill_dir=tmp_path / "spill"))


def test_work_over_a_cached_scan_is_kept_with_it_and_goes_with_it(tmp_path) -> None:
    """An aggregate over an unchanged shard is computed once; a write makes it recomputed (one
    with a WHERE: counts and sums without one follow the write, tests/unit/test_maintained.py)."""
    from federator.node.node import owners_sql
    from federator.query.result import QueryResult
    from federator.store.scan_cache import CachingLayer, ScanCache

    cache = ScanCache(256 << 20)
    shard = CachingLayer(Shard(tmp_path / "s", definition(), 0), cache)
    shard.apply([ChangelogRecord(b"a", b"1", 0, 1), ChangelogRecord(b"b", b"2", 1, 1)])
    calls = []

    duck = _counting_duck(tmp_path, calls)

    def run(request_spec: dict) -> QueryResult:
        result = shard.run(RangeQuery())
        owners_sql(duck, request_spec["sql"], [(result, shard.base)], cache)
        return result

    try:
        spec = {"sql": 'SELECT COUNT(*) AS "__a0" FROM rows WHERE k <> \'z\''}
        first = run(spec)
        second = run(spec)
        assert first.ok and second.ok, (first.message, second.message)
        assert second.batch is first.batch and len(calls) == 1
        assert first.batch.to_pylist() == [{"__a0": 2}]
        other = run({"sql": 'SELECT COUNT(v) AS "__a0" FROM rows'})  # other work: its own entry
        assert len(calls) == 2 and other.batch is not first.batch
        shard.apply([ChangelogRecord(b"c", b"3", 2, 1)])
        third = run(spec)
        assert len(calls) == 3 and third.batch.to_pylist() == [{"__a0": 3}]
        failed = run({"sql": "SELECT CAST(k AS INTEGER) FROM rows"})  # the data fails the SQL: the user's error
        assert not failed.ok and failed.code == "INVALID_DATA", failed
    finally:
        shard.close()


def test_owners_sql_runs_once_over_all_partitions_and_is_kept_until_one_changes(tmp_path) -> None:
    """A node's partitions of a store are filtered, ranked or pre-aggregated in one statement:
    the answer is what the statement gives over their union, on the first partition; a write
    to any of them makes it computed again, over all."""
    from federator.node.node import owners_sql
    from federator.store.scan_cache import CachingLayer, ScanCache

    cache = ScanCache(256 << 20)
    shards = [CachingLayer(Shard(tmp_path / f"s{p}", definition(), p), cache) for p in range(3)]
    for p, shard in enumerate(shards):
        shard.apply([ChangelogRecord(f"k{p}{i}".encode(), str(p * 10 + i).encode(), i, 1) for i in range(4)])
    calls = []

    duck = _counting_duck(tmp_path, calls)
    sql = 'SELECT k, v FROM rows WHERE CAST(v AS INTEGER) % 2 = 1 ORDER BY k DESC LIMIT 3'

    def run() -> list:
        results = [shard.run(RangeQuery()) for shard in shards]
        owners_sql(duck, sql, list(zip(results, [s.base for s in shards])), cache)
        return results

    try:
        first = run()
        assert calls == [12]  # one statement over the three partitions' 12 rows
        assert [r.partition for r in first] == [0, 1, 2] and all(r.ok for r in first)
        assert first[0].batch.to_pylist() == [{"k": "k23", "v": "23"}, {"k": "k21", "v": "21"}, {"k": "k13", "v": "13"}]
        assert first[1].batch.num_rows == first[2].batch.num_rows == 0
        assert first[1].batch.schema == first[0].batch.schema
        assert run()[0].batch is first[0].batch and calls == [12]  # nothing changed: kept
        shards[1].apply([ChangelogRecord(b"k15", b"15", 9, 1)])
        third = run()
        assert calls == [12, 13]
        assert [r["k"] for r in third[0].batch.to_pylist()] == ["k23", "k21", "k15"]
        bad = [shard.run(RangeQuery()) for shard in shards]
        owners_sql(duck, "SELECT CAST(k AS INTEGER) FROM rows", list(zip(bad, [s.base for s in shards])), cache)
        assert all(not r.ok and r.code == "INVALID_DATA" for r in bad)
    finally:
        for shard in shards:
            shard.close()


def test_a_scan_with_a_temporary_upper_bound_reads_the_whole_range(tmp_path) -> None:
    """RocksDB keeps a pointer to the bound's bytes: a bound nobody else holds must still
    stop the scan in the right place (it once stopped after the first key)."""
    shard = Shard(tmp_path / "s", definition(), 0)
    words = ["pa", "paple", "paricot", "pax", "pb", "pe"]
    shard.apply([ChangelogRecord(w.encode(), b"1", i, 1) for i, w in enumerate(words)])
    view = shard._view()
    for _ in range(20):
        got = [k for k, _ in view.scan(b"pa", bytes(bytearray(b"pb")))]  # the bound is a temporary
        _ = [bytes(64) for _ in range(1000)]  # churn, to reuse freed memory
        assert got == [b"pa", b"paple", b"paricot", b"pax"]


def test_what_a_handler_keeps_lasts_until_the_next_write_and_is_not_kept_across_one(open_shard, rec) -> None:
    shard = open_shard(definition())
    shard.apply([rec(b"a", b"one")])
    view = shard._view()
    built: list[int] = []

    def count() -> int:
        built.append(1)
        return sum(1 for _ in view.scan())

    assert view.kept("count", count) == 1 and view.kept("count", count) == 1 and len(built) == 1
    shard.apply([rec(b"b", b"two")])
    assert view.kept("count", count) == 2 and len(built) == 2

    def count_while_written() -> int:  # a write lands while the value is derived
        n = count()
        shard.apply([rec(b"c", b"three")])
        return n

    assert view.kept("racing", count_while_written) == 2  # what it read, for consistent() to discard
    assert view.kept("racing", count) == 3 and len(built) == 4  # not kept: derived again


def test_a_position_moves_through_offsets_without_data(open_shard, rec) -> None:
    """A transactional changelog's commit markers take offsets: read past, the position says so,
    in a write of its own that changes no data (and a position never moves back)."""
    shard = open_shard(definition())
    before, after = shard.apply([rec(b"k", b"v")], through=2)
    assert shard.offset == 2 and after > before
    assert shard.apply([], through=1) == (after, after) and shard.offset == 2
    assert shard.apply([], through=5)[1] > after and shard.offset == 5
    assert ok(shard, RangeQuery()) == [{"k": "k", "v": "v", "rowtime": ms(1_000)}]


def test_shards_read_together_are_read_again_when_a_write_lands_during_the_read(open_shard, rec) -> None:
    from federator.store.shard import read_together

    defn = definition()
    shards = [open_shard(defn, f"s{p}", p) for p in range(2)]
    shards[0].apply([rec(b"a", b"one")])
    shards[1].apply([rec(b"b", b"two")])
    reads: list[list[int]] = []

    def count(views) -> list[int]:
        reads.append([sum(1 for _ in v.scan()) for v in views])
        if len(reads) == 1:  # a write lands on the second shard while the first read runs
            shards[1].apply([rec(b"c", b"three")])
        return reads[-1]

    counts, positions = read_together(shards, count)
    assert counts == [1, 2] and len(reads) == 2  # the racing read was thrown away
    assert positions == [s.position for s in shards]

    def always_racing(views) -> list[int]:  # writes keep landing: the last read holds writers off
        n = [sum(1 for _ in v.scan()) for v in views]
        if shards[0]._lock.acquire(blocking=False):
            shards[0]._lock.release()
            shards[0].apply([rec(b"x%d" % len(reads), b"more")])
        reads.append(n)
        return n

    reads.clear()
    counts, positions = read_together(shards, always_racing, tries=3)
    assert len(reads) == 4 and counts == [4, 2] and positions == [s.position for s in shards]


def test_shards_read_together_again_at_the_same_states_share_the_last_reads_views(open_shard, rec) -> None:
    from federator.store.shard import TogetherReads, read_together

    defn = definition()
    shards = [open_shard(defn, f"s{p}", p) for p in range(2)]
    shards[0].apply([rec(b"a", b"one")])
    kept = TogetherReads()
    seen: list[list] = []

    def look(views) -> int:
        seen.append(views)
        return len(views)

    read_together(shards, look, kept=kept)
    _, positions = read_together(shards, look, kept=kept)
    assert seen[1] is seen[0] and positions == [s.position for s in shards]  # nothing written between them
    shards[1].apply([rec(b"b", b"two")])
    _, positions = read_together(shards, look, kept=kept)
    assert seen[2] is not seen[1] and positions == [s.position for s in shards]
    read_together(shards, lambda views: [sum(1 for _ in v.scan(stop=b"z")) for v in views], kept=kept)
    read_together(shards, look, kept=kept)
    assert seen[3] is not seen[2]  # a view a bounded scan used keeps its bounds: not shared again
    read_together(shards[:1], look, kept=kept)
    assert len(seen[4]) == 1  # other shards: their own views
