"""What keeps a large scan's memory down, and that the answers stay exactly what they were:
scans built a chunk of entries at a time (every chunk size gives the batch one build gives),
whole-shard scans kept out of RocksDB's block cache, Arrow answers written as bounded IPC
messages, and the node's Arrow memory pool."""

from __future__ import annotations

import io
import json
import struct
import tracemalloc
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pytest

from federator.catalog import StoreDefinition
from federator.query import RangeQuery, WindowRangeQuery
from federator.store import ChangelogRecord, Shard
from federator.store import arrow as store_arrow
from federator.store.arrow import build_batch, chunked, join_chunks, scan_batch
from federator.store.layout import session_key, window_key
from tests.registry import REGISTRY

TS = struct.Struct(">q")


def kv(key: str, value: dict | str, partitions: int = 1) -> StoreDefinition:
    spec = {"format": value, "name": "v"} if isinstance(value, str) else value
    return StoreDefinition.from_dict({"name": "s", "type": "kv", "topic": "s-changelog", "partitions": partitions,
                                      "key": {"name": "k", "format": key}, "value": spec}, REGISTRY)


JSON_VALUE = {"format": "json", "fields": [{"name": "name", "type": "string"}, {"name": "n", "type": "long"}]}


def entries(defn: StoreDefinition, n: int) -> list[tuple[bytes, bytes]]:
    """n (key, stored value) entries in key byte order, as a shard's scan yields them."""
    out = []
    for i in range(n):
        key = f"key-{i:06d}" if defn.key.name == "string" else i
        if defn.value.name == "json":
            value = json.dumps({"name": f"n{i}", "n": i * 7} if i % 3 else {"name": None}).encode()
        else:
            value = defn.value.serialize(i * -3 if defn.value.name == "long" else f"v{i}" * (i % 4))
        out.append((defn.key.serialize(key), TS.pack(1_700_000_000_000 + i) + value))
    return sorted(out)


# ---- building a scan a chunk at a time --------------------------------------------------------


@pytest.mark.parametrize("defn", [kv("string", "long"), kv("long", "string"), kv("long", JSON_VALUE)],
                         ids=["string-long", "long-string", "long-json"])
@pytest.mark.parametrize("n", [0, 1, 63, 64, 65, 200])
def test_a_scan_in_chunks_is_the_batch_of_one_build(defn: StoreDefinition, n: int) -> None:
    """Every chunk size, below and above the numpy path's threshold (64), and chunk boundaries
    at, before and after the last entry: the same rows, in the same order, with the same types."""
    schema = REGISTRY.store_type("kv").schema(defn)
    data = entries(defn, n)
    whole = build_batch(schema, defn, [k for k, _ in data], [v for _, v in data])
    for rows in sorted({1, 2, 7, 64, max(n - 1, 1), max(n, 1), n + 1}):
        got = scan_batch(schema, defn, iter(data), rows)
        assert got.schema == schema
        assert got.equals(whole), (rows, got.to_pylist()[:3], whole.to_pylist()[:3])


def test_a_failing_entry_fails_the_scan_whatever_the_chunk() -> None:
    defn = kv("string", "long")
    schema = REGISTRY.store_type("kv").schema(defn)
    data = entries(defn, 100)
    data[70] = (data[70][0], data[70][1] + b"x")  # 9 value bytes where a long has 8
    for rows in (10, 64, 1000):
        with pytest.raises(Exception, match="8 bytes"):
            scan_batch(schema, defn, iter(data), rows)


def test_chunked_splits_in_order_without_an_empty_tail() -> None:
    assert [len(c) for c in chunked(range(10), 4)] == [4, 4, 2]
    assert [len(c) for c in chunked(range(8), 4)] == [4, 4]
    assert list(chunked([], 4)) == []
    assert [x for c in chunked(iter(range(10)), 3) for x in c] == list(range(10))


def test_join_chunks_joins_in_order_and_lets_go_of_the_pieces() -> None:
    pieces = [pa.record_batch({"a": pa.array(range(i, i + 3)), "b": pa.array([f"{i}"] * 3)}) for i in (0, 3, 6)]
    expected = pa.concat_batches(pieces)
    given = list(pieces)
    joined = join_chunks(given)
    assert joined.equals(expected) and joined.schema == expected.schema
    assert given == []  # the caller's list no longer holds the pieces
    one = [pieces[0]]
    assert join_chunks(one) is pieces[0]


def test_a_scan_holds_the_python_objects_of_one_chunk_at_a_time() -> None:
    """The scan's own Python allocations stay near one chunk's, not the whole scan's: all of
    200,000 entries at once came to 28 MB here, one chunk at a time to about 5 MB."""
    defn = kv("string", "long")
    schema = REGISTRY.store_type("kv").schema(defn)
    n = 200_000

    def lazily() -> Iterator[tuple[bytes, bytes]]:  # made as they are read, like RocksDB's iterator
        for i in range(n):
            yield f"key-{i:07d}".encode(), TS.pack(i) + TS.pack(3 * i)

    scan_batch(schema, defn, iter(entries(defn, 100)))  # first use (imports) outside the measure
    tracemalloc.start()
    try:
        start, _ = tracemalloc.get_traced_memory()
        batch = scan_batch(schema, defn, lazily())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert batch.num_rows == n and batch.column(1)[n - 1].as_py() == 3 * (n - 1)
    assert peak - start < 8_000_000, f"{(peak - start) / 1e6:.1f} MB of Python objects at once"


# ---- on a shard: chunk boundaries in kv, window and session scans -----------------------------


@pytest.fixture
def shard_at(tmp_path: Path) -> Iterator:
    opened: list[Shard] = []

    def _open(defn: StoreDefinition, name: str = "s") -> Shard:
        s = Shard(tmp_path / name, defn, 0)
        opened.append(s)
        return s

    yield _open
    for s in opened:
        s.close()


def answers(shard: Shard, queries: list, rows: int, monkeypatch: pytest.MonkeyPatch) -> list[pa.RecordBatch]:
    monkeypatch.setattr(store_arrow, "SCAN_CHUNK_ROWS", rows)
    out = []
    for q in queries:
        r = shard.run(q)
        assert r.ok, r.message
        out.append(r.batch)
    return out


def same(a: list[pa.RecordBatch], b: list[pa.RecordBatch]) -> None:
    for x, y in zip(a, b, strict=True):
        assert x.schema == y.schema and x.equals(y), (x.to_pylist()[:3], y.to_pylist()[:3])


def test_kv_range_queries_across_chunk_boundaries(shard_at, monkeypatch) -> None:
    """Long keys are scanned in two byte ranges (negatives first): a chunk may span both."""
    defn = kv("long", "string")
    shard = shard_at(defn)
    keys = list(range(-25, 26))
    shard.apply([ChangelogRecord(defn.key.serialize(k), f"v{k}".encode(), i, 1_000 + i) for i, k in enumerate(keys)])
    queries = [RangeQuery(), RangeQuery(descending=True), RangeQuery(lower=-10, upper=10),
               RangeQuery(lower=-3, upper=3, lower_inclusive=False, descending=True), RangeQuery(lower=100)]
    one_build = answers(shard, queries, 10**9, monkeypatch)
    assert one_build[0].column(0).to_pylist() == keys
    assert one_build[1].column(0).to_pylist() == keys[::-1]
    assert one_build[4].num_rows == 0
    for rows in (1, 4, 7, 25, 26, 51, 52):
        same(answers(shard, queries, rows, monkeypatch), one_build)


def test_an_empty_shard_scans_to_an_empty_batch_of_its_schema(shard_at, monkeypatch) -> None:
    for type_ in ("kv", "window", "session"):
        spec = {"name": "s", "type": type_, "topic": "t", "partitions": 1, "key": {"name": "k", "format": "string"},
                "value": {"format": "long", "name": "v"}, **({"window_size_ms": 10} if type_ == "window" else {})}
        shard = shard_at(StoreDefinition.from_dict(spec, REGISTRY), type_)
        q = RangeQuery() if type_ == "kv" else WindowRangeQuery()
        (batch,) = answers(shard, [q], 3, monkeypatch)
        assert batch.num_rows == 0 and batch.schema == shard.schema


@pytest.mark.parametrize("type_", ["window", "session"])
def test_windowed_scans_across_chunk_boundaries(shard_at, monkeypatch, type_: str) -> None:
    spec = {"name": "w", "type": type_, "topic": "t", "partitions": 1, "key": {"name": "k", "format": "string"},
            "value": {"format": "string", "name": "v"}, **({"window_size_ms": 10} if type_ == "window" else {})}
    shard = shard_at(StoreDefinition.from_dict(spec, REGISTRY), type_)
    records = []
    for i, key in enumerate([b"a", b"ab", b"b", b"c", b"d"]):
        for j, start in enumerate((0, 10, 20, 30)):
            kb = window_key(key, start) if type_ == "window" else session_key(key, start, start + 5)
            records.append(ChangelogRecord(kb, f"{key.decode()}@{start}".encode(), len(records), start + i))
    shard.apply(records)
    queries = [WindowRangeQuery(), WindowRangeQuery(10, 20), WindowRangeQuery(25, None), WindowRangeQuery(None, -1)]
    one_build = answers(shard, queries, 10**9, monkeypatch)
    assert one_build[0].num_rows == 20 and one_build[3].num_rows == 0
    for rows in (1, 3, 4, 19, 20, 21):
        same(answers(shard, queries, rows, monkeypatch), one_build)


# ---- RocksDB's block cache ---------------------------------------------------------------------


def test_a_whole_shard_scan_leaves_the_block_cache_alone(shard_at) -> None:
    """A full scan reads every block once and the scan cache keeps its answer: caching the
    blocks too held a second copy of the shard in memory (about as large as the scan)."""
    defn = kv("string", "long")
    shard = shard_at(defn)
    shard.apply([ChangelogRecord(k, v, i, 1) for i, (k, v) in enumerate((k, v[8:]) for k, v in entries(defn, 5_000))])
    shard.db.flush()  # from the memtable into an SST file, read through blocks

    def cached() -> int:
        return shard.db.property_int_value("rocksdb.block-cache-usage") or 0

    before = cached()
    assert shard.run(RangeQuery()).batch.num_rows == 5_000
    assert shard.run(RangeQuery(descending=True)).batch.num_rows == 5_000
    assert cached() - before < 16_384, cached() - before  # no data blocks; at most an index block
    assert shard.run(RangeQuery(lower="key-001000", upper="key-004000")).batch.num_rows == 3_001
    assert cached() - before > 50_000  # a bounded range still fills it: lookups near it stay fast


# ---- Arrow answers: IPC messages of bounded size -----------------------------------------------


def test_a_large_batch_goes_out_as_several_bounded_messages(monkeypatch) -> None:
    from federator.http import formats

    monkeypatch.setattr(formats, "ARROW_MESSAGE_BYTES", 4_096)
    n = 10_000
    batch = pa.record_batch({"k": pa.array([f"key-{i:05d}" for i in range(n)]), "v": pa.array(range(n), pa.int64())})
    small = batch.slice(0, 10)
    empty = pa.RecordBatch.from_pylist([], schema=batch.schema)
    chunks = list(formats.arrow_chunks(batch.schema, iter([small, batch, empty])))
    reader = pa.ipc.open_stream(io.BytesIO(b"".join(chunks)))
    got = list(reader)
    assert pa.Table.from_batches(got).equals(pa.Table.from_batches([small, batch]))  # rows and order kept
    assert len(got) > batch.nbytes // 4_096  # the large batch in pieces; the small one and the empty one whole
    assert max(len(c) for c in chunks) < 4_096 + 1_024  # a piece and its message header
    assert [b.num_rows for b in got][0] == 10 and got[-1].num_rows == 0


# ---- the node's Arrow memory pool --------------------------------------------------------------


def test_the_node_allocates_arrow_memory_from_jemalloc_unless_told(monkeypatch) -> None:
    from federator.node_command import arrow_memory_pool

    before = pa.default_memory_pool()
    try:
        monkeypatch.delenv("ARROW_DEFAULT_MEMORY_POOL", raising=False)
        name = arrow_memory_pool()
        assert name in ("jemalloc", "system") and pa.default_memory_pool().backend_name == name
        pa.set_memory_pool(before)
        monkeypatch.setenv("ARROW_DEFAULT_MEMORY_POOL", "mimalloc")  # the operator's choice stands
        assert arrow_memory_pool() == before.backend_name
        assert pa.default_memory_pool().backend_name == before.backend_name
    finally:
        pa.set_memory_pool(before)
