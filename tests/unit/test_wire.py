"""The Arrow IPC encoding of per-partition results: round trips, schemas kept exactly, bad input."""

from __future__ import annotations

import io

import pyarrow as pa
import pytest

from federator.catalog import StoreDefinition
from federator.query import FailureReason, Position, QueryResult
from federator.query.wire import WireError, decode_results, encode_results, read_results, write_results
from tests.registry import REGISTRY

TOPIC = "app-scores-changelog"


def window_json_schema() -> pa.Schema:
    """A real store schema: window store, JSON value (one flat column per field, no struct)."""
    return StoreDefinition.from_dict(
        {
            "name": "scores",
            "type": "window",
            "topic": TOPIC,
            "partitions": 4,
            "window_size_ms": 60_000,
            "key": {"name": "user", "format": "string"},
            "value": {
                "format": "json",
                "fields": [
                    {"name": "score", "type": "long"},
                    {"name": "ratio", "type": "double"},
                    {"name": "active", "type": "boolean"},
                    {"name": "seen", "type": "timestamp"},
                    {"name": "label", "type": "string"},
                ],
            },
        },
        REGISTRY,
    ).arrow_schema()


def rows(schema: pa.Schema, n: int, offset: int = 0) -> pa.RecordBatch:
    data = []
    for i in range(offset, offset + n):
        row = {}
        for f in schema:
            if pa.types.is_timestamp(f.type) or pa.types.is_integer(f.type):
                row[f.name] = 1_700_000_000_000 + i
            elif pa.types.is_floating(f.type):
                row[f.name] = i / 3
            elif pa.types.is_boolean(f.type):
                row[f.name] = i % 2 == 0
            else:
                row[f.name] = f"u{i}" if i % 5 else None  # some nulls
        data.append(row)
    return pa.RecordBatch.from_pylist(data, schema=schema)


def assert_same(a: QueryResult, b: QueryResult) -> None:
    assert (a.partition, a.failure, a.message, a.position, a.execution_info) == (
        b.partition,
        b.failure,
        b.message,
        b.position,
        b.execution_info,
    )
    if a.ok:
        assert b.batch is not None and a.batch is not None
        assert b.batch.schema.equals(a.batch.schema)
        assert b.batch.equals(a.batch)
    else:
        assert b.batch is None


def test_mixed_results_round_trip_in_order() -> None:
    schema = window_json_schema()
    assert any(pa.types.is_timestamp(f.type) and f.type.tz == "UTC" for f in schema)
    assert not any(pa.types.is_struct(f.type) for f in schema)
    ok = QueryResult.success(2, rows(schema, 7), Position.of(TOPIC, 2, 41))
    ok.execution_info = ["scanned 7 windows", "took 1ms"]
    empty = QueryResult.success(0, rows(schema, 0), Position.of(TOPIC, 0, 5))
    failed = QueryResult.failed(1, FailureReason.NOT_UP_TO_BOUND, "partition 1 is at offset 3, bound asks for 9")
    absent = QueryResult.failed(3, FailureReason.NOT_PRESENT, "node b does not host partition 3")
    results = [ok, failed, empty, absent]

    decoded = decode_results(encode_results(results, schema))

    assert [r.partition for r in decoded] == [2, 1, 0, 3]
    for a, b in zip(results, decoded):
        assert_same(a, b)
    assert decoded[2].ok and decoded[2].batch is not None and decoded[2].batch.num_rows == 0


@pytest.mark.parametrize("reason", list(FailureReason))
def test_every_failure_reason_round_trips(reason: FailureReason) -> None:
    schema = pa.schema([("k", pa.string())])
    [r] = decode_results(encode_results([QueryResult.failed(0, reason, f"why: {reason.value} ü")], schema))
    assert r.failure is reason and r.message == f"why: {reason.value} ü" and r.batch is None and not r.ok


def test_types_and_timezones_kept_exactly() -> None:
    schema = pa.schema(
        [
            pa.field("k", pa.int32(), nullable=False),
            ("b", pa.binary()),
            ("t_ns_berlin", pa.timestamp("ns", tz="Europe/Berlin")),
            ("t_us_naive", pa.timestamp("us")),
            ("d", pa.float64()),
        ],
        metadata={b"store": b"s"},
    )
    batch = pa.RecordBatch.from_pylist(
        [{"k": 1, "b": b"\x00\xff", "t_ns_berlin": 1, "t_us_naive": 2, "d": -0.5}], schema=schema
    )
    data = encode_results([QueryResult.success(0, batch, Position.of("t", 0, 1))], schema)
    got_schema, [r] = read_results(data)
    assert got_schema.equals(schema, check_metadata=True)
    assert r.batch is not None and r.batch.schema.field("t_ns_berlin").type.tz == "Europe/Berlin"
    assert r.batch.schema.field("k").nullable is False
    assert r.batch.equals(batch)


def test_positions_with_several_topics_and_none() -> None:
    schema = pa.schema([("k", pa.string())])
    pos = Position({TOPIC: {0: 10, 3: 7}, "other": {1: 2}})
    batch = rows(schema, 2)
    results = [QueryResult(0, batch=batch, position=pos), QueryResult(1, batch=batch, position=None)]
    decoded = decode_results(encode_results(results, schema))
    assert decoded[0].position == pos and decoded[1].position is None


def test_success_without_batch_becomes_empty_success() -> None:
    schema = pa.schema([("k", pa.string())])
    [r] = decode_results(encode_results([QueryResult(4, batch=None, position=Position.of("t", 4, 1))], schema))
    assert r.ok and r.batch is not None and r.batch.num_rows == 0 and r.batch.schema.equals(schema)


def test_no_results_still_carries_the_schema() -> None:
    schema = window_json_schema()
    got_schema, results = read_results(encode_results([], schema))
    assert results == [] and got_schema.equals(schema)


def test_write_to_file_like_sink_and_read_from_file_like() -> None:
    schema = window_json_schema()
    results = [QueryResult.success(p, rows(schema, 3, offset=p * 10), Position.of(TOPIC, p, p)) for p in range(4)]
    sink = io.BytesIO()
    write_results(sink, results, schema)
    sink.seek(0)
    for a, b in zip(results, decode_results(sink)):
        assert_same(a, b)


def test_large_batch_round_trips() -> None:
    schema = pa.schema([("k", pa.int64()), ("t", pa.timestamp("ms", tz="UTC"))])
    n = 200_000
    cols = [pa.array(range(n), pa.int64()), pa.array(range(n), schema.field("t").type)]
    batch = pa.RecordBatch.from_arrays(cols, schema=schema)
    [r] = decode_results(encode_results([QueryResult.success(0, batch, Position.of("t", 0, 1))], schema))
    assert r.batch is not None and r.batch.equals(batch)


def test_batch_with_another_schema_is_refused_naming_the_partition() -> None:
    schema = pa.schema([("k", pa.string())])
    other = pa.RecordBatch.from_pylist([{"k": 1}], schema=pa.schema([("k", pa.int64())]))
    with pytest.raises(ValueError, match="partition 5"):
        encode_results([QueryResult.success(5, other, Position())], schema)


def test_garbage_is_a_wire_error() -> None:
    with pytest.raises(WireError, match="not an Arrow IPC result stream"):
        decode_results(b"<html>502 Bad Gateway</html>")


def test_plain_arrow_stream_without_headers_is_a_wire_error() -> None:
    schema = pa.schema([("k", pa.string())])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as w:
        w.write_batch(pa.RecordBatch.from_pylist([{"k": "a"}], schema=schema))
    with pytest.raises(WireError, match="no Federator header"):
        decode_results(sink.getvalue().to_pybytes())


def test_malformed_header_is_a_wire_error() -> None:
    schema = pa.schema([("k", pa.string())])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as w:
        w.write_batch(pa.RecordBatch.from_pylist([], schema=schema), custom_metadata={b"federator.result": b"{\"v\":1}"})
    with pytest.raises(WireError, match="malformed result header"):
        decode_results(sink.getvalue().to_pybytes())
