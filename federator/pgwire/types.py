"""Postgres types of Arrow columns: the OID a client is told, and each value's text and binary form.

One table (``_BY_OID``) says, per Postgres type, its size and how a Python value is written in the
text format (what psql shows) and the binary format (asyncpg and pgjdbc ask for it). Arrow types map
onto these OIDs, a list of one of them onto its Postgres array; whatever has no Postgres twin
(nested lists, structs, intervals) is sent as text.
Parameters come the other way: a bound value in text or binary form, read by its declared OID.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import math
import struct
import uuid
from dataclasses import dataclass
from typing import Any, Callable

import pyarrow as pa

BOOL, BYTEA, INT8, INT2, INT4, TEXT, JSON, FLOAT4, FLOAT8, UNKNOWN = 16, 17, 20, 21, 23, 25, 114, 700, 701, 705
VARCHAR, DATE, TIME, TIMESTAMP, TIMESTAMPTZ, INTERVAL, NUMERIC, UUID = 1043, 1082, 1083, 1114, 1184, 1186, 1700, 2950

_EPOCH_DATE = dt.date(2000, 1, 1)
_EPOCH_TS = dt.datetime(2000, 1, 1)
_EPOCH_TSTZ = dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc)


def _float_text(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "Infinity" if v > 0 else "-Infinity"
    return repr(v)


def _ts_text(v: dt.datetime) -> str:
    if v.tzinfo is not None:
        v = v.astimezone(dt.timezone.utc)  # every session's TimeZone is UTC
        return v.replace(tzinfo=None).isoformat(sep=" ") + "+00"
    return v.isoformat(sep=" ")


def _numeric_binary(v: decimal.Decimal) -> bytes:
    """Postgres's binary NUMERIC: base-10000 digits with a weight, sign and display scale."""
    if v.is_nan():
        return struct.pack("!hhHH", 0, 0, 0xC000, 0)
    sign, digits, exponent = v.as_tuple()
    assert isinstance(exponent, int)
    dscale = max(0, -exponent)
    text = "".join(map(str, digits))
    point = len(text) + exponent  # digits before the decimal point
    if point < 0:
        text, point = "0" * -point + text, 0
    text += "0" * max(0, point - len(text))
    whole, fraction = text[:point], text[point:]
    whole = "0" * (-len(whole) % 4) + whole  # base-10000 groups align on the decimal point
    fraction += "0" * (-len(fraction) % 4)
    groups = [int(whole[i:i + 4]) for i in range(0, len(whole), 4)]
    weight = len(groups) - 1
    groups += [int(fraction[i:i + 4]) for i in range(0, len(fraction), 4)]
    while groups and groups[0] == 0:
        groups.pop(0)
        weight -= 1
    while groups and groups[-1] == 0:
        groups.pop()
    if not groups:
        weight = 0
    return struct.pack(f"!hhHH{len(groups)}H", len(groups), weight, 0x4000 if sign else 0, dscale, *groups)


@dataclass(frozen=True)
class PgType:
    oid: int
    name: str
    size: int  # typlen: bytes of a fixed-size value, -1 for variable
    text: Callable[[Any], str]
    binary: Callable[[Any], bytes]


def _text_binary(v: Any) -> bytes:
    return _any_text(v).encode("utf-8")


def _any_text(v: Any) -> str:
    if isinstance(v, (dict, list)):
        return json.dumps(v, default=str, ensure_ascii=False)
    if isinstance(v, bool):
        return "t" if v else "f"
    if isinstance(v, bytes):
        return "\\x" + v.hex()
    if isinstance(v, float):
        return _float_text(v)
    if isinstance(v, dt.datetime):
        return _ts_text(v)
    return str(v)


_TYPES = [
    PgType(BOOL, "bool", 1, lambda v: "t" if v else "f", lambda v: b"\x01" if v else b"\x00"),
    PgType(BYTEA, "bytea", -1, lambda v: "\\x" + bytes(v).hex(), bytes),
    PgType(INT8, "int8", 8, lambda v: str(int(v)), lambda v: struct.pack("!q", int(v))),
    PgType(INT2, "int2", 2, lambda v: str(int(v)), lambda v: struct.pack("!h", int(v))),
    PgType(INT4, "int4", 4, lambda v: str(int(v)), lambda v: struct.pack("!i", int(v))),
    PgType(TEXT, "text", -1, _any_text, _text_binary),
    PgType(VARCHAR, "varchar", -1, _any_text, _text_binary),
    PgType(JSON, "json", -1, _any_text, _text_binary),
    PgType(FLOAT4, "float4", 4, lambda v: _float_text(float(v)), lambda v: struct.pack("!f", float(v))),
    PgType(FLOAT8, "float8", 8, lambda v: _float_text(float(v)), lambda v: struct.pack("!d", float(v))),
    PgType(DATE, "date", 4, lambda v: v.isoformat(), lambda v: struct.pack("!i", (v - _EPOCH_DATE).days)),
    PgType(TIME, "time", 8, lambda v: v.isoformat(),
           lambda v: struct.pack("!q", ((v.hour * 60 + v.minute) * 60 + v.second) * 1_000_000 + v.microsecond)),
    PgType(TIMESTAMP, "timestamp", 8, _ts_text,
           lambda v: struct.pack("!q", (v.replace(tzinfo=None) - _EPOCH_TS) // dt.timedelta(microseconds=1))),
    PgType(TIMESTAMPTZ, "timestamptz", 8, _ts_text,
           lambda v: struct.pack("!q", ((v if v.tzinfo else v.replace(tzinfo=dt.timezone.utc)) - _EPOCH_TSTZ)
                                 // dt.timedelta(microseconds=1))),
    PgType(NUMERIC, "numeric", -1, lambda v: str(v), lambda v: _numeric_binary(decimal.Decimal(v))),
    PgType(UUID, "uuid", 16, str, lambda v: uuid.UUID(str(v)).bytes),
]
# each scalar type's array type: element OID -> array OID
ARRAYS = {BOOL: 1000, BYTEA: 1001, INT2: 1005, INT4: 1007, TEXT: 1009, VARCHAR: 1015, INT8: 1016, FLOAT4: 1021,
          FLOAT8: 1022, TIMESTAMP: 1115, DATE: 1182, TIME: 1183, TIMESTAMPTZ: 1185, NUMERIC: 1231, UUID: 2951}
_ARRAY_SPECIALS = set('{}",\\')


def _element_text(element: PgType, v: Any) -> str:
    if v is None:
        return "NULL"
    text = element.text(v)
    if text == "" or text.upper() == "NULL" or any(c in _ARRAY_SPECIALS or c.isspace() for c in text):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


def _array(element: PgType, oid: int) -> PgType:
    """The one-dimensional array of ``element``'s type, as Postgres writes it: ``{a,"b c",NULL}`` in
    text; in binary dimensions, a null flag, the element OID, then each element's length and bytes."""
    def binary(values: list) -> bytes:
        if not values:
            return struct.pack("!iiI", 0, 0, element.oid)
        head = struct.pack("!iiIii", 1, int(any(v is None for v in values)), element.oid, len(values), 1)
        parts = [struct.pack("!i", -1) if v is None else struct.pack("!i", len(b := element.binary(v))) + b
                 for v in values]
        return head + b"".join(parts)

    return PgType(oid, "_" + element.name, -1,
                  lambda values: "{" + ",".join(_element_text(element, v) for v in values) + "}", binary)


_BY_OID = {t.oid: t for t in _TYPES}
_BY_OID.update({array: _array(_BY_OID[element], array) for element, array in ARRAYS.items()})


def by_oid(oid: int) -> PgType:
    """The type of ``oid``; text for one this module does not write."""
    return _BY_OID.get(oid, _BY_OID[TEXT])


def oid_of(t: pa.DataType) -> int:
    """The Postgres type a column of Arrow type ``t`` is described as."""
    if pa.types.is_boolean(t):
        return BOOL
    if pa.types.is_int8(t) or pa.types.is_int16(t) or pa.types.is_uint8(t):
        return INT2
    if pa.types.is_int32(t) or pa.types.is_uint16(t):
        return INT4
    if pa.types.is_int64(t) or pa.types.is_uint32(t):
        return INT8
    if pa.types.is_integer(t):  # uint64 does not fit int8
        return NUMERIC
    if pa.types.is_float16(t) or pa.types.is_float32(t):
        return FLOAT4
    if pa.types.is_float64(t):
        return FLOAT8
    if pa.types.is_decimal(t):
        return NUMERIC
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return VARCHAR
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t) \
            or pa.types.is_binary_view(t):
        return BYTEA
    if pa.types.is_date(t):
        return DATE
    if pa.types.is_time(t):
        return TIME
    if pa.types.is_timestamp(t):
        return TIMESTAMPTZ if t.tz is not None else TIMESTAMP
    if isinstance(t, pa.ExtensionType) and "uuid" in str(t.extension_name).lower():
        return UUID
    if (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)) \
            and not pa.types.is_nested(t.value_type) and oid_of(t.value_type) in ARRAYS:
        return ARRAYS[oid_of(t.value_type)]
    return TEXT  # nested lists, structs, maps, intervals: their text


def row_encoders(oids: list[int], formats: list[int]) -> list[Callable[[Any], bytes]]:
    """Per column, the function writing a value in the format the client asked (0 text, 1 binary)."""
    out = []
    for i, oid in enumerate(oids):
        fmt = formats[0] if len(formats) == 1 else (formats[i] if i < len(formats) else 0)
        t = by_oid(oid)
        out.append(t.binary if fmt == 1 else (lambda v, f=t.text: f(v).encode("utf-8")))
    return out


def encode_rows(batch: pa.RecordBatch, encoders: list[Callable[[Any], bytes]]) -> list[list[bytes | None]]:
    columns = [c.to_pylist() for c in batch.columns]
    return [[None if v is None else enc(v) for v, enc in zip(row, encoders)] for row in zip(*columns)]


# ---- parameters ----------------------------------------------------------------------------

def _bool(text: str) -> bool:
    t = text.strip().lower()
    if t in ("t", "true", "y", "yes", "on", "1"):
        return True
    if t in ("f", "false", "n", "no", "off", "0"):
        return False
    raise ValueError(f"{text!r} is not a boolean")


def _tstz(text: str) -> dt.datetime:
    v = dt.datetime.fromisoformat(text.replace(" ", "T", 1) if "T" not in text else text)
    return v if v.tzinfo else v.replace(tzinfo=dt.timezone.utc)


_PARAM_TEXT: dict[int, Callable[[str], Any]] = {
    BOOL: _bool, INT2: int, INT4: int, INT8: int, FLOAT4: float, FLOAT8: float, NUMERIC: decimal.Decimal,
    DATE: dt.date.fromisoformat, TIMESTAMP: lambda s: dt.datetime.fromisoformat(s), TIMESTAMPTZ: _tstz,
    BYTEA: lambda s: bytes.fromhex(s[2:]) if s.startswith("\\x") else s.encode("utf-8"),
}


def _numeric_from_binary(b: bytes) -> decimal.Decimal:
    ndigits, weight, sign, dscale = struct.unpack_from("!hhHH", b)
    if sign == 0xC000:
        return decimal.Decimal("NaN")
    digits = struct.unpack_from(f"!{ndigits}H", b, 8)
    whole = 0
    for d in digits:
        whole = whole * 10000 + d
    exact = decimal.Context(prec=4 * (abs(weight) + ndigits + 2) + dscale)  # every digit, never rounded
    value = decimal.Decimal(whole).scaleb(4 * (weight - ndigits + 1), context=exact)
    value = value.quantize(decimal.Decimal(1).scaleb(-dscale), context=exact)
    return value.copy_negate() if sign == 0x4000 else value  # unary minus would round to 28 digits


_PARAM_BINARY: dict[int, Callable[[bytes], Any]] = {
    BOOL: lambda b: b != b"\x00", INT2: lambda b: struct.unpack("!h", b)[0], INT4: lambda b: struct.unpack("!i", b)[0],
    INT8: lambda b: struct.unpack("!q", b)[0], FLOAT4: lambda b: struct.unpack("!f", b)[0],
    FLOAT8: lambda b: struct.unpack("!d", b)[0], BYTEA: bytes, NUMERIC: _numeric_from_binary,
    DATE: lambda b: _EPOCH_DATE + dt.timedelta(days=struct.unpack("!i", b)[0]),
    TIMESTAMP: lambda b: _EPOCH_TS + dt.timedelta(microseconds=struct.unpack("!q", b)[0]),
    TIMESTAMPTZ: lambda b: _EPOCH_TSTZ + dt.timedelta(microseconds=struct.unpack("!q", b)[0]),
    UUID: lambda b: str(uuid.UUID(bytes=b)),
}


_ELEMENTS = {array: element for element, array in ARRAYS.items()}


def array_text_elements(text: str) -> list[str | None]:
    """The elements of a one-dimensional array literal, ``{a,"b c",NULL}``, as their texts."""
    body = text.strip()
    if body.startswith("["):  # [1:3]={...}: the bounds change nothing here
        body = body.split("=", 1)[-1].strip()
    if not (body.startswith("{") and body.endswith("}")):
        raise ValueError(f"{text!r} is not an array: write it as {{a,b,c}}")
    inner, out, i = body[1:-1], [], 0
    if not inner.strip():
        return []
    while True:
        while i < len(inner) and inner[i].isspace():
            i += 1
        if inner[i:i + 1] == "{":
            raise ValueError("only one-dimensional arrays are taken as parameters")
        if inner[i:i + 1] == '"':
            i, chars = i + 1, []
            while i < len(inner) and inner[i] != '"':
                i += inner[i] == "\\"
                chars.append(inner[i:i + 1])
                i += 1
            if i >= len(inner):
                raise ValueError(f"{text!r} has an unterminated quote")
            out.append("".join(chars))
            end = inner.find(",", i)
            end = len(inner) if end < 0 else end
            if inner[i + 1:end].strip():
                raise ValueError(f"{text!r}: text after a quoted element")
        else:
            end = inner.find(",", i)
            end = len(inner) if end < 0 else end
            word = inner[i:end].strip()
            out.append(None if word.upper() == "NULL" else word)
        if end >= len(inner):
            return out
        i = end + 1


def _array_elements_binary(b: bytes) -> tuple[int, list[bytes | None]]:
    """The element OID and elements of a one-dimensional array in the binary format."""
    ndim, _, element = struct.unpack_from("!iiI", b)
    if ndim == 0:
        return element, []
    if ndim != 1:
        raise ValueError("only one-dimensional arrays are taken as parameters")
    count, _ = struct.unpack_from("!ii", b, 12)
    out: list[bytes | None] = []
    at = 20
    for _ in range(count):
        (size,) = struct.unpack_from("!i", b, at)
        at += 4
        out.append(None if size < 0 else b[at:at + size])
        at += max(size, 0)
    return element, out


def _decode_array(value: bytes, oid: int, fmt: int) -> list:
    if fmt == 1:
        element, parts = _array_elements_binary(value)
        return [decode_parameter(p, element, 1) for p in parts]
    return [None if p is None else decode_parameter(p.encode("utf-8"), _ELEMENTS[oid], 0)
            for p in array_text_elements(value.decode("utf-8"))]


def decode_parameter(value: bytes | None, oid: int, fmt: int) -> Any:
    """A bound parameter as the engine takes it; ValueError says what did not read."""
    if value is None:
        return None
    if oid in _ELEMENTS:
        try:
            return _decode_array(value, oid, fmt)
        except struct.error as e:
            raise ValueError(f"array value of type {by_oid(oid).name} does not read: {e}") from None
    if fmt == 1:
        reader = _PARAM_BINARY.get(oid)
        if reader is None:  # text-like types send their UTF-8 bytes in binary too
            return value.decode("utf-8")
        try:
            return reader(value)
        except (struct.error, ValueError) as e:
            raise ValueError(f"binary value of type {by_oid(oid).name} does not read: {e}") from None
    text = value.decode("utf-8")
    reader_t = _PARAM_TEXT.get(oid)
    if reader_t is None:
        return text
    try:
        return reader_t(text)
    except (ValueError, decimal.InvalidOperation) as e:
        raise ValueError(f"{text!r} is not a {by_oid(oid).name}: {e}") from None
