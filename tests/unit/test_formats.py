"""Key/value formats: byte compatibility with Kafka's serializers, Arrow decoding, JSON records."""

from __future__ import annotations

import datetime as dt
import json
import math
import struct
import types

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from federator.formats import (
    TIMESTAMP,
    BytesFormat,
    FormatError,
    JsonFormat,
)
from federator.plugin import hookimpl, load_plugins
from tests.registry import REGISTRY

get_format = REGISTRY.format  # formats by name, as a node finds them

FAST = settings(max_examples=100, deadline=None)

LONG_MIN, LONG_MAX = -(1 << 63), (1 << 63) - 1
INT_MIN, INT_MAX = -(1 << 31), (1 << 31) - 1

# ---- byte compatibility with Kafka's serializers ----------------------------------------


@pytest.mark.parametrize(
    ("fmt", "value", "expected"),
    [
        # LongSerializer: 8 bytes big-endian two's complement
        ("long", 1, b"\x00" * 7 + b"\x01"),
        ("long", 0, b"\x00" * 8),
        ("long", -1, b"\xff" * 8),
        ("long", 256, b"\x00" * 6 + b"\x01\x00"),
        ("long", LONG_MAX, b"\x7f" + b"\xff" * 7),
        ("long", LONG_MIN, b"\x80" + b"\x00" * 7),
        # IntegerSerializer: 4 bytes big-endian
        ("int", 1, b"\x00\x00\x00\x01"),
        ("int", -1, b"\xff" * 4),
        ("int", INT_MAX, b"\x7f\xff\xff\xff"),
        ("int", INT_MIN, b"\x80\x00\x00\x00"),
        ("int", 0x01020304, b"\x01\x02\x03\x04"),
        # DoubleSerializer: IEEE 754 big-endian (Double.doubleToLongBits)
        ("double", 1.0, bytes.fromhex("3ff0000000000000")),
        ("double", -2.0, bytes.fromhex("c000000000000000")),
        ("double", 0.0, bytes.fromhex("0000000000000000")),
        ("double", -0.0, bytes.fromhex("8000000000000000")),
        ("double", math.inf, bytes.fromhex("7ff0000000000000")),
        ("double", 3, bytes.fromhex("4008000000000000")),  # ints are accepted as doubles
        # StringSerializer: UTF-8
        ("string", "abc", b"abc"),
        ("string", "", b""),
        ("string", "é€😀", "é€😀".encode("utf-8")),
        ("string", "héllo", b"h\xc3\xa9llo"),
        # ByteArraySerializer: as is
        ("bytes", b"\x00\xff", b"\x00\xff"),
        ("bytes", bytearray(b"ab"), b"ab"),
    ],
)
def test_serialize_is_byte_compatible_with_kafka(fmt: str, value, expected: bytes) -> None:
    out = get_format(fmt).serialize(value)
    assert type(out) is bytes
    assert out == expected


def test_double_deserializes_kafka_bytes() -> None:
    assert get_format("double").deserialize(bytes.fromhex("3ff0000000000000")) == 1.0
    neg_zero = get_format("double").deserialize(bytes.fromhex("8000000000000000"))
    assert neg_zero == 0.0 and math.copysign(1.0, neg_zero) == -1.0


def test_long_and_int_deserialize_kafka_bytes() -> None:
    assert get_format("long").deserialize(b"\xff" * 8) == -1
    assert get_format("long").deserialize(b"\x00" * 7 + b"\x2a") == 42
    assert get_format("int").deserialize(b"\xff\xff\xff\xfe") == -2


# ---- round trips ---------------------------------------------------------------------------


@FAST
@given(st.text())
def test_string_round_trip(v: str) -> None:
    f = get_format("string")
    assert f.deserialize(f.serialize(v)) == v


@FAST
@given(st.integers(min_value=LONG_MIN, max_value=LONG_MAX))
def test_long_round_trip(v: int) -> None:
    f = get_format("long")
    data = f.serialize(v)
    assert len(data) == 8
    assert f.deserialize(data) == v
    assert data == struct.pack(">q", v)


@FAST
@given(st.integers(min_value=INT_MIN, max_value=INT_MAX))
def test_int_round_trip(v: int) -> None:
    f = get_format("int")
    data = f.serialize(v)
    assert len(data) == 4
    assert f.deserialize(data) == v


@FAST
@given(st.floats(allow_nan=False))
def test_double_round_trip(v: float) -> None:
    f = get_format("double")
    out = f.deserialize(f.serialize(v))
    assert out == v
    assert math.copysign(1.0, out) == math.copysign(1.0, v)


@FAST
@given(st.binary())
def test_bytes_round_trip(v: bytes) -> None:
    f = get_format("bytes")
    assert f.deserialize(f.serialize(v)) == v


def test_double_nan_round_trips_as_nan() -> None:
    f = get_format("double")
    assert math.isnan(f.deserialize(f.serialize(math.nan)))


# ---- decode_many ------------------------------------------------------------------------------

VALUES = {
    "string": st.text(),
    "bytes": st.binary(),
    "long": st.integers(min_value=LONG_MIN, max_value=LONG_MAX),
    "int": st.integers(min_value=INT_MIN, max_value=INT_MAX),
    "double": st.floats(allow_nan=False),
}
ARROW = {"string": pa.string(), "bytes": pa.binary(), "long": pa.int64(), "int": pa.int32(), "double": pa.float64()}


@pytest.mark.parametrize("name", list(VALUES))
@pytest.mark.parametrize("count", [0, 1, 5, 63, 64, 65, 300])
def test_decode_many_declared_type_for_few_and_many(name: str, count: int) -> None:
    f = get_format(name)
    # deterministic values of each kind
    pyvals = {
        "string": [f"v{i}é" for i in range(count)],
        "bytes": [bytes([i % 256]) * (i % 5) for i in range(count)],
        "long": [(i - count // 2) * 1_000_000_007 for i in range(count)],
        "int": [(i - count // 2) * 1009 for i in range(count)],
        "double": [(i - count // 2) / 3 for i in range(count)],
    }[name]
    arr = f.decode_many([f.serialize(v) for v in pyvals])
    assert arr.type == ARROW[name] == f.arrow_type
    assert len(arr) == count
    assert arr.to_pylist() == pyvals


@pytest.mark.parametrize("name", list(VALUES))
def test_decode_many_matches_deserialize(name: str) -> None:
    f = get_format(name)

    @settings(max_examples=30, deadline=None)
    @given(st.lists(VALUES[name], max_size=100))
    def check(values) -> None:
        data = [f.serialize(v) for v in values]
        arr = f.decode_many(data)
        assert arr.type == f.arrow_type
        assert arr.to_pylist() == [f.deserialize(d) for d in data]

    check()


@pytest.mark.parametrize("name", list(VALUES))
def test_encode_array_matches_serialize(name: str) -> None:
    """The vectorized encoder (the Spark sink's path) writes the bytes serialize writes, for
    sliced arrays too (offsets that do not start at zero)."""
    f = get_format(name)

    @settings(max_examples=30, database=None, deadline=None)
    @given(st.lists(VALUES[name], max_size=100), st.integers(0, 3))
    def check(values, cut) -> None:
        arr = pa.array(values, ARROW[name]).slice(min(cut, len(values)))
        encoded = f.encode_array(arr)
        assert pa.types.is_binary(encoded.type) or pa.types.is_fixed_size_binary(encoded.type)
        assert encoded.to_pylist() == [f.serialize(v) for v in values[min(cut, len(values)):]]

    check()


@pytest.mark.parametrize("name", list(VALUES))
def test_encode_array_rejects_nulls(name: str) -> None:
    with pytest.raises(FormatError, match="cannot encode null"):
        get_format(name).encode_array(pa.array([None], ARROW[name]))


def test_encode_array_of_other_types_goes_through_serialize() -> None:
    with pytest.raises(FormatError):  # does not fit: raises, is not wrapped around
        get_format("int").encode_array(pa.array([2 ** 40], pa.int64()))
    assert get_format("double").encode_array(pa.array([3], pa.int64())).to_pylist() == [struct.pack(">d", 3.0)]
    assert get_format("bytes").encode_array(pa.array(["é"])).to_pylist() == ["é".encode()]
    with pytest.raises(FormatError, match="expects str"):
        get_format("string").encode_array(pa.array([1]))
    fields = [("n", "long"), ("s", "string")]
    records = pa.array([{"n": 1, "s": "é"}, {"n": None, "s": None}])
    assert JsonFormat(fields).encode_array(records).to_pylist() == [
        JsonFormat(fields).serialize(r) for r in records.to_pylist()]


def test_string_decode_many_many_values_is_string_not_binary() -> None:
    arr = get_format("string").decode_many([b"x"] * 100)
    assert arr.type == pa.string()
    assert arr.to_pylist() == ["x"] * 100


@pytest.mark.parametrize("count", [3, 100])
def test_string_decode_many_rejects_invalid_utf8(count: int) -> None:
    data = [b"ok"] * (count - 1) + [b"\xff\xfe"]
    with pytest.raises(Exception):
        get_format("string").decode_many(data)


@pytest.mark.parametrize(("name", "width"), [("long", 8), ("int", 4), ("double", 8)])
def test_fixed_width_rejects_wrong_length(name: str, width: int) -> None:
    f = get_format(name)
    with pytest.raises(FormatError, match=f"expects {width} bytes, got 3"):
        f.deserialize(b"abc")
    with pytest.raises(FormatError, match=f"expects {width} bytes, got 3"):
        f.decode_many([b"\x00" * width, b"abc"])


@pytest.mark.parametrize(("name", "width"), [("long", 8), ("int", 4), ("double", 8)])
def test_fixed_width_decode_many_rejects_each_wrong_length_even_if_total_fits(name: str, width: int) -> None:
    # One value a byte short, the next a byte long: the total is right, each value is not.
    f = get_format(name)
    with pytest.raises(FormatError):
        f.decode_many([b"\x01" * (width - 1), b"\x01" * (width + 1)])


# ---- coercion errors -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("long", "1", "long format expects int, got str"),
        ("long", True, "long format expects int, got bool"),
        ("long", 1.5, "long format expects int, got float"),
        ("long", None, "long format expects int"),
        ("long", 1 << 63, "long format holds"),
        ("long", -(1 << 63) - 1, "long format holds"),
        ("int", 1 << 31, "int format holds -2147483648..2147483647, got 2147483648"),
        ("int", INT_MIN - 1, "int format holds"),
        ("int", [1], "int format expects int, got list"),
        ("double", "1.0", "double format expects a number, got str"),
        ("double", False, "double format expects a number, got bool"),
        ("string", 5, "string format expects str, got int"),
        ("string", b"x", "string format expects str, got bytes"),
        ("bytes", 5, "bytes format expects bytes, got int"),
    ],
)
def test_serialize_wrong_type_or_range_gives_clear_error(name: str, value, message: str) -> None:
    with pytest.raises(FormatError) as e:
        get_format(name).serialize(value)
    assert message in str(e.value)


def test_integral_floats_are_accepted_for_integer_formats() -> None:
    assert get_format("long").serialize(3.0) == get_format("long").serialize(3)
    assert get_format("int").serialize(-7.0) == b"\xff\xff\xff\xf9"


def test_format_error_is_a_value_error() -> None:
    assert issubclass(FormatError, ValueError)


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [("long", "-42", -42), ("int", "7", 7), ("double", "2.5", 2.5), ("string", "x", "x"), ("bytes", "é", "é".encode())],
)
def test_parse_text(name: str, text: str, expected) -> None:
    assert get_format(name).parse(text) == expected


@pytest.mark.parametrize(("name", "text"), [("long", "abc"), ("int", "1.5"), ("double", "one")])
def test_parse_bad_text(name: str, text: str) -> None:
    with pytest.raises(FormatError, match=repr(text)):
        get_format(name).parse(text)


# ---- JSON records ------------------------------------------------------------------------------

ALL_FIELDS = [
    ("s", "string"),
    ("l", "long"),
    ("i", "int"),
    ("d", "double"),
    ("b", "boolean"),
    ("t", "timestamp"),
]


def test_json_arrow_type_has_one_field_per_declared_field() -> None:
    f = JsonFormat(ALL_FIELDS)
    assert f.arrow_type == pa.struct(
        [
            pa.field("s", pa.string()),
            pa.field("l", pa.int64()),
            pa.field("i", pa.int32()),
            pa.field("d", pa.float64()),
            pa.field("b", pa.bool_()),
            pa.field("t", TIMESTAMP),
        ]
    )
    assert TIMESTAMP == pa.timestamp("ms", tz="UTC")
    assert not f.key_capable


def test_json_decode_all_field_types() -> None:
    f = JsonFormat(ALL_FIELDS)
    data = [
        json.dumps({"s": "x", "l": 1 << 40, "i": -5, "d": 1.5, "b": True, "t": 1_700_000_000_000}).encode(),
        json.dumps({"s": "y", "l": -1, "i": 7, "d": 2, "b": False, "t": "2023-11-14T22:13:20Z"}).encode(),
    ]
    arr = f.decode_many(data)
    assert arr.type == f.arrow_type
    rows = arr.to_pylist()
    utc = dt.timezone.utc
    assert rows[0]["s"] == "x" and rows[0]["l"] == 1 << 40 and rows[0]["i"] == -5
    assert rows[0]["d"] == 1.5 and rows[0]["b"] is True
    assert rows[0]["t"] == dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=utc)
    assert rows[1]["d"] == 2.0 and isinstance(rows[1]["d"], float) and rows[1]["b"] is False
    assert rows[1]["t"] == dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=utc)


def test_json_missing_fields_become_null_and_extra_fields_are_ignored() -> None:
    f = JsonFormat(ALL_FIELDS)
    arr = f.decode_many([b'{"s": "only", "extra": 1}', b"{}"])
    assert arr.to_pylist() == [
        {"s": "only", "l": None, "i": None, "d": None, "b": None, "t": None},
        {"s": None, "l": None, "i": None, "d": None, "b": None, "t": None},
    ]
    cols = f.decode_columns([b'{"l": 3}'])
    assert [c.type for c in cols] == [fld.type for fld in f.arrow_type]
    assert [c.to_pylist() for c in cols] == [[None], [3], [None], [None], [None], [None]]


def test_json_decode_many_empty_keeps_type() -> None:
    f = JsonFormat(ALL_FIELDS)
    arr = f.decode_many([])
    assert arr.type == f.arrow_type and len(arr) == 0


@pytest.mark.parametrize(
    "value",
    [
        1_700_000_000_123,
        1_700_000_000_123.0,
        "2023-11-14T22:13:20.123Z",
        "2023-11-14T22:13:20.123+00:00",
        "2023-11-14T23:13:20.123+01:00",
        "2023-11-14T22:13:20.123",  # no zone: UTC
        dt.datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=dt.timezone.utc),
        dt.datetime(2023, 11, 14, 22, 13, 20, 123000),  # naive: UTC
        dt.datetime(2023, 11, 14, 17, 13, 20, 123000, tzinfo=dt.timezone(dt.timedelta(hours=-5))),
    ],
)
def test_json_timestamp_accepts_millis_iso_and_datetimes(value) -> None:
    f = JsonFormat([("t", "timestamp")])
    assert f.coerce({"t": value}) == {"t": 1_700_000_000_123}


def test_json_timestamp_before_epoch() -> None:
    f = JsonFormat([("t", "timestamp")])
    assert f.coerce({"t": "1969-12-31T23:59:59Z"}) == {"t": -1000}


@FAST
@given(
    st.fixed_dictionaries(
        {},
        optional={
            "s": st.text(),
            "l": st.integers(min_value=LONG_MIN, max_value=LONG_MAX),
            "i": st.integers(min_value=INT_MIN, max_value=INT_MAX),
            "d": st.floats(allow_nan=False, allow_infinity=False),
            "b": st.booleans(),
            "t": st.integers(min_value=-(10**13), max_value=10**13),
        },
    )
)
def test_json_round_trip(record: dict) -> None:
    f = JsonFormat(ALL_FIELDS)
    data = f.serialize(record)
    expected = {name: record.get(name) for name, _ in ALL_FIELDS}
    assert f.deserialize(data) == expected
    assert json.loads(data) == expected
    assert f.parse(data.decode()) == expected
    assert f.decode_many([data]).to_pylist()[0].keys() == expected.keys()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"{not json", "json format: not valid JSON"),
        (b"", "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b"[1, 2]", "json format expects an object (dict), got list"),
        (b'"text"', "expects an object"),
        (b'{"l": "x"}', "json field 'l': expected an integer, got 'x'"),
        (b'{"l": 1.5}', "json field 'l'"),
        (b'{"l": true}', "json field 'l'"),
        (b'{"l": 9223372036854775808}', "json field 'l': 9223372036854775808 does not fit in 64 bits"),
        (b'{"i": 2147483648}', "json field 'i': 2147483648 does not fit in 32 bits"),
        (b'{"i": -2147483649}', "does not fit in 32 bits"),
        (b'{"d": "1.0"}', "json field 'd': expected a number"),
        (b'{"d": false}', "json field 'd'"),
        (b'{"s": 5}', "json field 's': expected a string, got 5"),
        (b'{"b": 1}', "json field 'b': expected true or false, got 1"),
        (b'{"t": "yesterday"}', "json field 't': expected epoch milliseconds or an ISO-8601 time, got 'yesterday'"),
        (b'{"t": true}', "json field 't'"),
        (b'{"t": [1]}', "json field 't'"),
    ],
)
def test_json_bad_input_gives_clear_error(data: bytes, message: str) -> None:
    f = JsonFormat(ALL_FIELDS)
    with pytest.raises(FormatError) as e:
        f.deserialize(data)
    assert message in str(e.value)
    with pytest.raises(FormatError):
        f.decode_many([b"{}", data])


def test_json_serialize_rejects_non_dict_and_bad_fields() -> None:
    f = JsonFormat([("n", "long")])
    with pytest.raises(FormatError, match="expects an object"):
        f.serialize([1])
    with pytest.raises(FormatError, match="json field 'n'"):
        f.serialize({"n": "seven"})


def test_json_int_field_accepts_integral_float() -> None:
    f = JsonFormat([("i", "int")])
    assert f.deserialize(b'{"i": 3.0}') == {"i": 3}


def test_json_unknown_field_type() -> None:
    with pytest.raises(FormatError, match="'decimal'"):
        JsonFormat([("x", "decimal")])


# ---- the registry -------------------------------------------------------------------------------


def test_get_format_returns_named_formats() -> None:
    for name in ("string", "bytes", "long", "int", "double"):
        assert get_format(name).name == name
    assert set(REGISTRY.formats) >= {"string", "bytes", "long", "int", "double", "json"}
    f = get_format("json", [("a", "long")])
    assert isinstance(f, JsonFormat) and f.fields == [("a", "long")]
    assert get_format("json", [("b", "string")]).fields == [("b", "string")]  # each store its own


def test_get_format_unknown_name() -> None:
    with pytest.raises(FormatError) as e:
        get_format("avro")
    assert "unknown format 'avro'" in str(e.value)
    assert "long" in str(e.value)  # and it lists what there is


@pytest.mark.parametrize("fields", [None, []])
def test_get_format_json_without_fields(fields) -> None:
    with pytest.raises(FormatError, match="json format needs declared fields"):
        get_format("json", fields)


class _Json(BytesFormat):
    name = "json"


@pytest.mark.parametrize("fmt", [BytesFormat(), _Json()], ids=["bytes", "json"])
def test_a_format_name_is_registered_once(fmt) -> None:
    plugin = types.SimpleNamespace(register_formats=hookimpl(lambda: [fmt]))
    registry = load_plugins({"again": plugin}, names=())
    (failure,) = registry.failures
    assert failure.name == "again" and f"format {fmt.name} is already registered" in failure.error
    assert registry.formats[fmt.name] is not fmt  # the built-in one stays
    assert not any(p.name == "again" for p in registry.plugins)
