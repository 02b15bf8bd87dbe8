"""SQL result bodies: value conventions, the four formats, streaming, content negotiation."""

from __future__ import annotations

import base64
import csv
import datetime as dt
import io
import json
from decimal import Decimal
from typing import Any, Iterator

import pyarrow as pa
import pytest
from werkzeug.datastructures import MIMEAccept

from federator.http import create_app
from federator.http.formats import (
    MEDIA_TYPES, arrow_chunks, choose_format, csv_chunks, json_chunks, jsonable, ndjson_chunks, sql_type_name,
)
from federator.errors import SqlError
from federator.sql.result import SqlRequest, SqlResult
from tests.registry import REGISTRY

TS = pa.timestamp("ms", tz="UTC")
MAX64, MIN64 = 2**63 - 1, -(2**63)
T0 = 1_700_000_000_123  # 2023-11-14T22:13:20.123Z


def trailer() -> dict:
    return {"consistency_token": "tok", "stats": {"rows": 0}}


def json_doc(schema: pa.Schema, batches: list[pa.RecordBatch]) -> dict:
    return json.loads(b"".join(json_chunks(schema, batches, trailer)))


def rows_both_paths(arr: pa.Array) -> list[Any]:
    """The column's JSON values via the per-value path (1-row batches) and the vectorized one
    (one big batch); both must agree, or a row's text would depend on its batch size."""
    schema = pa.schema([("c", arr.type)])
    big = pa.RecordBatch.from_arrays([pa.concat_arrays([arr] * 40)], schema=schema)
    small = [pa.RecordBatch.from_arrays([arr.slice(i, 1)], schema=schema) for i in range(len(arr))]
    vec = [r[0] for r in json_doc(schema, [big])["rows"]][: len(arr)]
    per = [r[0] for r in json_doc(schema, small)["rows"]]
    assert vec == per
    return per


# --- value conventions -------------------------------------------------------------------


def test_integers_stay_exact_at_the_extremes() -> None:
    assert rows_both_paths(pa.array([MIN64, MAX64, 0, None], pa.int64())) == [MIN64, MAX64, 0, None]
    assert rows_both_paths(pa.array([2**64 - 1], pa.uint64())) == [2**64 - 1]
    text = b"".join(json_chunks(pa.schema([("c", pa.int64())]), [pa.record_batch([pa.array([MAX64])], ["c"])], trailer))
    assert b"[9223372036854775807]" in text  # a number, not a string and not a float


def test_values_past_64_bits_and_maps_keep_their_exact_text() -> None:
    # an integer SUM is DuckDB's HUGEINT (decimal, scale 0): past 64 bits its JSON writer
    # (orjson) refuses it, and the json module writes it, the same number
    huge = 2**70 + 1
    assert rows_both_paths(pa.array([Decimal(huge), Decimal(-huge), None], pa.decimal128(38, 0))) == [huge, -huge, None]
    schema = pa.schema([("c", pa.decimal128(38, 0))])
    text = b"".join(json_chunks(schema, [pa.record_batch([pa.array([Decimal(huge)], schema[0].type)], schema=schema)],
                                trailer))
    assert f"[[{huge}]]".encode() in text
    assert rows_both_paths(pa.array([[(1, 2.5), (2, None)]], pa.map_(pa.int64(), pa.float64()))) == [[[1, 2.5], [2, None]]]


def test_floats_nan_and_infinity_become_null() -> None:
    vals = rows_both_paths(pa.array([1.5, float("nan"), float("inf"), float("-inf"), None, -0.0, 1e300]))
    assert vals == [1.5, None, None, None, None, -0.0, 1e300]


@pytest.mark.parametrize(
    ("unit", "tz", "value", "expected"),
    [
        ("ms", "UTC", T0, "2023-11-14T22:13:20.123Z"),
        ("ms", "America/New_York", T0, "2023-11-14T22:13:20.123Z"),  # the instant, shown in UTC
        ("ms", None, T0, "2023-11-14T22:13:20.123Z"),  # naive is taken as UTC
        ("s", "UTC", T0 // 1000, "2023-11-14T22:13:20Z"),
        ("us", "+02:00", T0 * 1000 + 456, "2023-11-14T22:13:20.123456Z"),
        ("ns", "UTC", T0 * 1_000_000 + 456_789, "2023-11-14T22:13:20.123456789Z"),
        ("ms", "UTC", -1, "1969-12-31T23:59:59.999Z"),
        ("ms", "UTC", 0, "1970-01-01T00:00:00.000Z"),
    ],
)
def test_timestamps_are_iso_utc_with_z(unit: str, tz: str | None, value: int, expected: str) -> None:
    assert rows_both_paths(pa.array([value, None], pa.timestamp(unit, tz=tz))) == [expected, None]


def test_other_types() -> None:
    assert rows_both_paths(pa.array([b"\x00\xff", b"", None], pa.binary())) == ["AP8=", "", None]
    assert rows_both_paths(pa.array([b"ab"], pa.binary(2))) == [base64.b64encode(b"ab").decode()]
    assert rows_both_paths(pa.array([True, False, None])) == [True, False, None]
    assert rows_both_paths(pa.array([dt.date(2024, 2, 29), None], pa.date32())) == ["2024-02-29", None]
    assert rows_both_paths(pa.array([dt.date(2024, 2, 29)], pa.date64())) == ["2024-02-29"]
    assert rows_both_paths(pa.array([Decimal("12345678901234567890.12"), None], pa.decimal128(22, 2))) == [
        "12345678901234567890.12", None]
    assert rows_both_paths(pa.array([dt.time(1, 2, 3, 500000)], pa.time64("us"))) == ["01:02:03.500000"]
    assert rows_both_paths(pa.array([dt.timedelta(seconds=1, milliseconds=500), dt.timedelta(0)],
                                    pa.duration("ms"))) == ["PT1.5S", "PT0S"]
    assert rows_both_paths(pa.array([[1, None], None, []], pa.list_(pa.int64()))) == [[1, None], None, []]
    st = pa.array([{"a": 1, "t": dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)}],
                  pa.struct([("a", pa.int64()), ("t", TS)]))
    assert rows_both_paths(st) == [{"a": 1, "t": "2024-01-01T00:00:00Z"}]
    assert rows_both_paths(pa.array(["x", "y", "x", None]).dictionary_encode()) == ["x", "y", "x", None]
    assert rows_both_paths(pa.array([None, None], pa.null())) == [None, None]


def test_strings_unicode_and_escapes_round_trip() -> None:
    vals = ["héllo ✓ 日本", 'quote " back \\ slash', "line\nbreak\t\x00", "", None, "😀"]
    assert rows_both_paths(pa.array(vals)) == vals
    body = b"".join(json_chunks(pa.schema([("s", pa.string())]), [pa.record_batch([pa.array(["日本"])], ["s"])], trailer))
    assert "日本".encode() in body  # UTF-8 text, not \\u escapes


def test_jsonable_for_python_rows() -> None:
    row = {"t": dt.datetime(2024, 1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=1))), "b": b"\x01",
           "f": float("nan"), "d": Decimal("1.10"), "day": dt.date(2024, 1, 2), "n": None, "l": (1, 2)}
    assert jsonable(row) == {"t": "2024-01-01T00:00:00Z", "b": "AQ==", "f": None, "d": "1.10",
                             "day": "2024-01-02", "n": None, "l": [1, 2]}


def test_sql_type_names() -> None:
    cases = {
        pa.int8(): "TINYINT", pa.int16(): "SMALLINT", pa.int32(): "INTEGER", pa.int64(): "BIGINT",
        pa.uint64(): "UBIGINT", pa.float32(): "FLOAT", pa.float64(): "DOUBLE", pa.string(): "VARCHAR",
        pa.large_string(): "VARCHAR", pa.bool_(): "BOOLEAN", TS: "TIMESTAMP WITH TIME ZONE", pa.timestamp("ns"): "TIMESTAMP",
        pa.binary(): "BLOB", pa.date32(): "DATE", pa.time32("ms"): "TIME", pa.decimal128(10, 2): "DECIMAL(10,2)",
        pa.list_(pa.int64()): "BIGINT[]", pa.struct([("a", pa.int32())]): "STRUCT(a INTEGER)",
        pa.map_(pa.string(), pa.float64()): "MAP(VARCHAR, DOUBLE)", pa.null(): "NULL",
        pa.dictionary(pa.int32(), pa.string()): "VARCHAR", pa.duration("ms"): "INTERVAL",
    }
    assert {str(t): sql_type_name(t) for t in cases} == {str(t): n for t, n in cases.items()}


# --- the four formats ----------------------------------------------------------------------

SCHEMA = pa.schema([("k", pa.string()), ("n", pa.int64()), ("f", pa.float64()), ("t", TS), ("b", pa.binary())])


def batch(start: int, n: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({
        "k": [f"k{i}" for i in range(start, start + n)], "n": list(range(start, start + n)),
        "f": [i / 2 for i in range(start, start + n)], "t": [T0 + i for i in range(start, start + n)],
        "b": [bytes([i % 256]) for i in range(start, start + n)],
    }, schema=SCHEMA)


def test_json_layout_and_trailer_read_at_the_end() -> None:
    stats = {"rows": 0}

    def batches() -> Iterator[pa.RecordBatch]:
        for i in range(3):
            stats["rows"] += 2  # the engine counts as it goes; the trailer must see the final count
            yield batch(i * 2, 2)

    chunks = list(json_chunks(SCHEMA, batches(), lambda: {"consistency_token": "t1", "stats": stats}))
    assert len(chunks) == 5  # header, one per batch, trailer: streamed, never built whole
    doc = json.loads(b"".join(chunks))
    assert doc["columns"] == [{"name": "k", "type": "VARCHAR"}, {"name": "n", "type": "BIGINT"},
                              {"name": "f", "type": "DOUBLE"}, {"name": "t", "type": "TIMESTAMP WITH TIME ZONE"},
                              {"name": "b", "type": "BLOB"}]
    assert doc["rows"][0] == ["k0", 0, 0.0, "2023-11-14T22:13:20.123Z", "AA=="]
    assert len(doc["rows"]) == 6 and doc["consistency_token"] == "t1" and doc["stats"] == {"rows": 6}


def test_json_empty_result_and_empty_batches() -> None:
    empty = pa.RecordBatch.from_pylist([], schema=SCHEMA)
    for batches in ([], [empty], [empty, batch(0, 1), empty]):
        doc = json_doc(SCHEMA, batches)
        assert len(doc["rows"]) == (1 if len(batches) == 3 else 0)


def test_json_error_mid_stream_ends_the_document_with_the_error() -> None:
    def batches() -> Iterator[pa.RecordBatch]:
        yield batch(0, 2)
        raise SqlError("TIMEOUT", "partition 3 did not answer within 10000 ms", partitions=[3])

    doc = json.loads(b"".join(json_chunks(SCHEMA, batches(), trailer)))
    assert len(doc["rows"]) == 2 and "stats" not in doc
    assert doc["error"] == {"code": "TIMEOUT", "message": "partition 3 did not answer within 10000 ms", "partitions": [3]}


def test_ndjson() -> None:
    chunks = list(ndjson_chunks(SCHEMA, [batch(0, 2), batch(2, 1)]))
    assert len(chunks) == 2
    lines = b"".join(chunks).decode().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"k": "k0", "n": 0, "f": 0.0, "t": "2023-11-14T22:13:20.123Z", "b": "AA=="},
        {"k": "k1", "n": 1, "f": 0.5, "t": "2023-11-14T22:13:20.124Z", "b": "AQ=="},
        {"k": "k2", "n": 2, "f": 1.0, "t": "2023-11-14T22:13:20.125Z", "b": "Ag=="},
    ]

    def failing() -> Iterator[pa.RecordBatch]:
        yield batch(0, 1)
        raise RuntimeError("disk on fire")

    last = json.loads(b"".join(ndjson_chunks(SCHEMA, failing())).decode().splitlines()[-1])
    assert last == {"error": {"code": "INTERNAL", "message": "RuntimeError: disk on fire"}}


def test_csv_conventions() -> None:
    schema = pa.schema([("s", pa.string()), ("n", pa.int64()), ("f", pa.float64()), ("t", TS), ("b", pa.binary()),
                        ("ok", pa.bool_()), ("l", pa.list_(pa.int64()))])
    b1 = pa.RecordBatch.from_pydict({"s": ["a,\"b\"", "", None], "n": [MAX64, None, -1], "f": [0.5, float("nan"), None],
                                     "t": [T0, None, 0], "b": [b"\x00\xff", None, b""], "ok": [True, None, False],
                                     "l": [[1, 2], None, []]}, schema=schema)
    chunks = list(csv_chunks(schema, [b1, b1.slice(0, 1)]))
    assert len(chunks) >= 2
    text = b"".join(chunks).decode()
    lines = text.splitlines()
    assert lines[0] == '"s","n","f","t","b","ok","l"'  # the header once, not per batch
    assert lines[1] == '"a,""b""",9223372036854775807,0.5,"2023-11-14T22:13:20.123Z","AP8=",true,"[1,2]"'
    assert lines[2] == '"",,,,,,'  # an empty string is quoted; NULL (and NaN) is an empty field
    assert lines[3] == ',-1,,"1970-01-01T00:00:00.000Z","",false,"[]"'
    assert len(lines) == 5
    assert list(csv.reader(io.StringIO(text)))[1][0] == 'a,"b"'


def test_csv_header_even_without_rows() -> None:
    assert b"".join(csv_chunks(SCHEMA, [])).decode().splitlines() == ['"k","n","f","t","b"']


def test_arrow_stream_round_trips_batch_by_batch() -> None:
    batches = [batch(0, 2), batch(2, 3)]
    chunks = list(arrow_chunks(SCHEMA, iter(batches)))
    assert len(chunks) >= 3  # schema, then a chunk per batch
    table = pa.ipc.open_stream(b"".join(chunks)).read_all()
    assert table.schema == SCHEMA and table.equals(pa.Table.from_batches(batches))



# --- choosing the format ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("requested", "accept", "expected"),
    [
        (None, None, "json"),
        (None, "*/*", "json"),
        (None, "text/html,application/xhtml+xml", "json"),  # a browser: fall back rather than 406
        (None, "text/csv", "csv"),
        (None, "application/x-ndjson", "ndjson"),
        (None, "application/json;q=0.5, application/vnd.apache.arrow.stream", "arrow"),
        ("csv", "application/vnd.apache.arrow.stream", "csv"),  # the body wins
        ("NDJSON", None, "ndjson"),
        ("application/vnd.apache.arrow.stream", None, "arrow"),
    ],
)
def test_choose_format(requested: Any, accept: str | None, expected: str) -> None:
    parsed = MIMEAccept([(v.split(";")[0].strip(), float(v.split("q=")[1]) if "q=" in v else 1.0)
                         for v in accept.split(",")]) if accept else None
    assert choose_format(requested, parsed) == expected


@pytest.mark.parametrize("bad", ["xml", "", 3, ["json"]])
def test_unknown_format_names_the_valid_ones(bad: Any) -> None:
    with pytest.raises(SqlError) as e:
        choose_format(bad, None)
    assert e.value.code == "INVALID_PARAMETER" and e.value.status == 400
    assert "'format'" in e.value.message and all(name in e.value.message for name in MEDIA_TYPES)


class FakeNode:
    node_id, state, cluster_secret = "n1", "RUNNING", None

    def __init__(self) -> None:
        self.consumed = 0

    def sql(self, request: SqlRequest) -> SqlResult:
        def batches() -> Iterator[pa.RecordBatch]:
            for i in range(3):
                self.consumed += 1
                yield batch(i * 2, 2)

        return SqlResult(SCHEMA, batches(), "tok-1", {"rows": 6})


@pytest.fixture
def node() -> FakeNode:
    return FakeNode()


@pytest.fixture
def client(node: FakeNode) -> Any:
    return create_app(node, REGISTRY).test_client()


@pytest.mark.parametrize(
    ("body_format", "accept", "media_type"),
    [
        (None, None, "application/json"),
        (None, "text/csv", "text/csv"),
        (None, "application/x-ndjson", "application/x-ndjson"),
        (None, "application/vnd.apache.arrow.stream", "application/vnd.apache.arrow.stream"),
        ("arrow", "text/csv", "application/vnd.apache.arrow.stream"),
    ],
)
def test_negotiation_over_http(client: Any, body_format: str | None, accept: str | None, media_type: str) -> None:
    body: dict = {"sql": "SELECT * FROM s"}
    if body_format:
        body["format"] = body_format
    resp = client.post("/v1/sql", json=body, headers={"Accept": accept} if accept else {})
    assert resp.status_code == 200 and resp.mimetype == media_type
    token = resp.headers.get("X-Federator-Consistency-Token")
    data = resp.get_data()
    if media_type == "application/json":
        assert token is None and json.loads(data)["consistency_token"] == "tok-1"
    else:
        assert token == "tok-1"
    if media_type.endswith("arrow.stream"):
        assert pa.ipc.open_stream(data).read_all().num_rows == 6
    elif media_type == "text/csv":
        assert len(data.decode().splitlines()) == 7
    elif media_type.endswith("ndjson"):
        assert len(data.decode().splitlines()) == 6


@pytest.mark.parametrize("fmt", list(MEDIA_TYPES))
def test_http_body_streams_lazily(client: Any, node: FakeNode, fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from federator.http import sql_routes
    from federator.sql import limits

    monkeypatch.setattr(sql_routes, "SMALL_BODY", 0)  # answers above it stream; this one stands for a big one
    monkeypatch.setattr(limits, "READ_AHEAD_BYTES", 1)  # and it is larger than what is read before answering
    resp = client.post("/v1/sql", json={"sql": "SELECT 1", "format": fmt}, buffered=False)
    assert node.consumed == 1  # only the first batch is fetched before the status goes out
    chunks = [c for c in resp.response if c]
    assert node.consumed == 3 and len(chunks) > 2
    resp.close()


def test_unknown_format_over_http(client: Any) -> None:
    resp = client.post("/v1/sql", json={"sql": "SELECT 1", "format": "parquet"})
    assert resp.status_code == 400
    err = resp.get_json()["error"]
    assert err["code"] == "INVALID_PARAMETER" and "json, ndjson, csv, arrow" in err["message"]


def test_json_from_python_rows_equals_json_from_arrow() -> None:
    """Point lookups write JSON straight from Python rows; it must be byte-for-byte the Arrow path's."""
    from federator.http.formats import json_chunks, json_rows_body

    schema = pa.schema([("s", pa.string()), ("i", pa.int64()), ("f", pa.float64()), ("b", pa.bool_()),
                        ("t", pa.timestamp("ms", tz="UTC")), ("raw", pa.binary()), ("n", pa.int32())])
    rows = [("Ünï", -(2 ** 63), float("nan"), True, 1_700_000_000_123, b"\x00\xff", None),
            (None, 7, float("inf"), None, -1, None, 3),
            ("x", None, 2.5, False, None, b"", -(2 ** 31))]
    batch = pa.RecordBatch.from_arrays([pa.array([r[i] for r in rows], f.type) for i, f in enumerate(schema)],
                                       schema=schema)
    trailer = {"consistency_token": "tok", "stats": {"rows": 3}}
    arrow_body = b"".join(json_chunks(schema, [batch], lambda: trailer))
    assert json_rows_body(schema, rows, trailer) == arrow_body
    assert json_rows_body(schema, [], trailer) == b"".join(json_chunks(schema, [], lambda: trailer))
    nested = pa.schema([("l", pa.list_(pa.int64()))])
    assert json_rows_body(nested, [([1],)], trailer) is None  # such columns take the Arrow path


def test_a_failure_mid_stream_leaves_csv_and_arrow_no_reader_accepts() -> None:
    """Once the status is sent, CSV and Arrow end with a marker readers refuse, not a short result."""
    import io

    import pyarrow.csv as pa_csv
    import pyarrow.ipc as pa_ipc

    from federator.http.failure_marks import failure_at_end
    from federator.http.formats import arrow_chunks, csv_chunks
    from federator.errors import SqlError

    schema = pa.schema([("a", pa.int64()), ("b", pa.string())])

    def failing() -> Iterator[pa.RecordBatch]:
        yield pa.RecordBatch.from_pylist([{"a": 1, "b": 'say "x"'}] * 3, schema=schema)
        raise SqlError("TIMEOUT", 'partition 5 did not answer "in time"')

    bodies = {}
    for fmt, chunks in (("csv", csv_chunks), ("arrow", arrow_chunks)):
        out = b""
        with pytest.raises(SqlError):  # still raised, so a server that can cuts the body off too
            for chunk in chunks(schema, failing()):
                out += chunk
        bodies[fmt] = out
    assert failure_at_end("csv", bodies["csv"]) == 'TIMEOUT: partition 5 did not answer "in time"'
    assert failure_at_end("arrow", bodies["arrow"]) is not None
    with pytest.raises(pa.ArrowInvalid, match="Expected 2 columns, got 3"):
        pa_csv.read_csv(io.BytesIO(bodies["csv"]))
    with pytest.raises((pa.ArrowInvalid, OSError)):
        pa_ipc.open_stream(io.BytesIO(bodies["arrow"])).read_all()
    whole = b"".join(csv_chunks(schema, iter([pa.RecordBatch.from_pylist([{"a": 1, "b": "x"}], schema=schema)])))
    assert failure_at_end("csv", whole) is None and failure_at_end("arrow", b"") is None
