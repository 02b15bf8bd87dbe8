"""Key and value formats, byte-compatible with Kafka's standard serializers.

Each format turns Python values into the bytes Kafka's serializers write
(StringSerializer, LongSerializer, IntegerSerializer, DoubleSerializer,
ByteArraySerializer, or a JSON object) and decodes many at once into Arrow
columns of one fixed type. Key formats also say how a value range maps onto
byte ranges, so that range scans return keys in value order.

This module only defines formats. Which names stand for which format is the registry's
business (federator.plugin.registry): the built-in plugin registers these, plugins add more.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import struct
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Sequence

import numpy as np
import pyarrow as pa
from federator.errors import FederatorError


class FormatError(FederatorError, ValueError):
    """A value that does not fit its format, or a format that does not exist."""

    code = "INVALID_PARAMETER"


@dataclass(frozen=True)
class ByteRange:
    """A contiguous run of encoded keys; ``reverse`` when byte order is the reverse of value order."""

    start: bytes | None  # inclusive; None = from the first key
    stop: bytes | None  # exclusive; None = to the last key
    reverse: bool = False


def prefix_stop(prefix: bytes) -> bytes | None:
    """The smallest byte string above every string that starts with ``prefix`` (None: no
    such bound): the exclusive stop of a prefix scan."""
    trimmed = prefix.rstrip(b"\xff")
    return trimmed[:-1] + bytes([trimmed[-1] + 1]) if trimmed else None


def binary_buffers(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """The offsets (int32, len(arr) + 1) and data bytes of a binary array without nulls,
    as numpy views: lets fixed-width values be decoded in one step."""
    _, offsets, data = arr.buffers()
    off = np.frombuffer(offsets, np.int32)[arr.offset:arr.offset + len(arr) + 1]
    return off, (np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8))


def _no_nulls(name: str, values: pa.Array) -> None:
    if values.null_count:
        raise FormatError(f"{name} format cannot encode null ({values.null_count} of {len(values)} values)")


def _after(b: bytes) -> bytes:
    """The smallest byte string greater than ``b``: turns an inclusive bound into an exclusive one."""
    return b + b"\x00"


class Format:
    """A serializer: one Arrow column from many byte strings."""

    name: ClassVar[str]
    arrow_type: ClassVar[pa.DataType]
    key_capable: ClassVar[bool] = True
    # A format whose columns a store declares (json): the registry keeps one instance as a
    # template and makes each store its own with ``with_fields``.
    takes_fields: ClassVar[bool] = False

    def with_fields(self, fields: Sequence[tuple[str, str]]) -> Format:
        """This format over a store's declared fields (only formats that take fields)."""
        raise FormatError(f"format {self.name!r} takes no declared fields")

    def serialize(self, value: Any) -> bytes:
        raise NotImplementedError

    def deserialize(self, data: bytes) -> Any:
        raise NotImplementedError

    def decode_many(self, data: Sequence[bytes]) -> pa.Array:
        return pa.array([self.deserialize(d) for d in data], self.arrow_type)

    def decode_array(self, data: pa.Array) -> pa.Array:
        """``decode_many`` over an Arrow binary array; built-in formats decode it without
        making a Python object per value."""
        return self.decode_many(data.to_pylist())

    def encode_array(self, values: pa.Array) -> pa.Array:
        """``serialize`` of every value of an Arrow array (no nulls): a binary or fixed-size
        binary array, the inverse of ``decode_array``. Built-in formats encode their own
        Arrow type without making a Python object per value (the Spark sink's path)."""
        _no_nulls(self.name, values)
        return pa.array([self.serialize(v) for v in values.to_pylist()], pa.binary())

    def parse(self, text: str) -> Any:
        """A value from its string form (URLs, the command line)."""
        return text

    def coerce(self, value: Any) -> Any:
        """``value`` as this format's Python type, or FormatError saying why not."""
        return value

    def byte_ranges(
        self, lower: Any, upper: Any, lower_inclusive: bool = True, upper_inclusive: bool = True
    ) -> list[ByteRange]:
        """Byte ranges covering [lower, upper] in ascending value order (None = open)."""
        start = None if lower is None else self.serialize(lower)
        stop = None if upper is None else self.serialize(upper)
        if start is not None and not lower_inclusive:
            start = _after(start)
        if stop is not None and upper_inclusive:
            stop = _after(stop)
        return [ByteRange(start, stop)]


class StringFormat(Format):
    name = "string"
    arrow_type = pa.string()

    def serialize(self, value: Any) -> bytes:
        return self.coerce(value).encode("utf-8")

    def deserialize(self, data: bytes) -> str:
        return data.decode("utf-8")

    def decode_many(self, data: Sequence[bytes]) -> pa.Array:
        if len(data) < 64:  # a cast has a fixed cost that only pays off on many values
            return pa.array([d.decode("utf-8") for d in data], pa.string())
        # One validated cast instead of a Python decode per value.
        return pa.array(data, pa.binary()).cast(pa.string())

    def decode_array(self, data: pa.Array) -> pa.Array:
        return data.cast(pa.string())

    def encode_array(self, values: pa.Array) -> pa.Array:
        if not (pa.types.is_string(values.type) or pa.types.is_large_string(values.type)):
            return super().encode_array(values)
        _no_nulls(self.name, values)
        return values.cast(pa.binary())  # Arrow strings are UTF-8 already

    def coerce(self, value: Any) -> str:
        if not isinstance(value, str):
            raise FormatError(f"string format expects str, got {type(value).__name__} {value!r}")
        return value


class BytesFormat(Format):
    name = "bytes"
    arrow_type = pa.binary()

    def serialize(self, value: Any) -> bytes:
        return self.coerce(value)

    def deserialize(self, data: bytes) -> bytes:
        return data

    def decode_many(self, data: Sequence[bytes]) -> pa.Array:
        return pa.array(data, pa.binary())

    def decode_array(self, data: pa.Array) -> pa.Array:
        return data

    def encode_array(self, values: pa.Array) -> pa.Array:
        t = values.type
        if not (pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t)):
            return super().encode_array(values)
        _no_nulls(self.name, values)
        return values.cast(pa.binary())

    def parse(self, text: str) -> bytes:
        return text.encode("utf-8")

    def coerce(self, value: Any) -> bytes:
        if isinstance(value, (bytearray, memoryview)):
            return bytes(value)
        if isinstance(value, str):
            return value.encode("utf-8")
        if not isinstance(value, bytes):
            raise FormatError(f"bytes format expects bytes, got {type(value).__name__} {value!r}")
        return value


class _FixedWidth(Format):
    """Big-endian fixed-width numbers (Kafka's Long/Integer/DoubleSerializer)."""

    code: ClassVar[str]
    width: ClassVar[int]

    def serialize(self, value: Any) -> bytes:
        return struct.pack(">" + self.code, self.coerce(value))

    def deserialize(self, data: bytes) -> Any:
        if len(data) != self.width:
            raise FormatError(f"{self.name} format expects {self.width} bytes, got {len(data)}")
        return struct.unpack(">" + self.code, data)[0]

    def decode_many(self, data: Sequence[bytes]) -> pa.Array:
        width = self.width
        for d in data:
            if len(d) != width:
                raise FormatError(f"{self.name} format expects {width} bytes, got {len(d)}")
        joined = b"".join(data)
        return pa.array(struct.unpack(f">{len(data)}{self.code}", joined), self.arrow_type)

    def decode_array(self, data: pa.Array) -> pa.Array:
        offsets, buf = binary_buffers(data)
        n = len(data)
        if n and not (offsets[1:] - offsets[:-1] == self.width).all():
            bad = int((offsets[1:] - offsets[:-1])[(offsets[1:] - offsets[:-1]) != self.width][0])
            raise FormatError(f"{self.name} format expects {self.width} bytes, got {bad}")
        raw = buf[offsets[0]:offsets[0] + n * self.width]
        values = raw.view(">" + self.code).astype(self.arrow_type.to_pandas_dtype())
        return pa.array(values, self.arrow_type)

    def encode_array(self, values: pa.Array) -> pa.Array:
        if not (pa.types.is_integer(values.type) or pa.types.is_floating(values.type)):
            return super().encode_array(values)
        _no_nulls(self.name, values)
        # A cast to this format's Arrow type first: a value that does not fit raises (Arrow's
        # safe cast), where numpy's astype would wrap it.
        if values.type != self.arrow_type:
            try:
                values = values.cast(self.arrow_type)
            except pa.ArrowInvalid as e:
                raise FormatError(f"{self.name} format: {e}") from None
        native = values.to_numpy(zero_copy_only=False)
        data = native.astype(">" + self.code)  # Kafka's serializers: big-endian
        return pa.Array.from_buffers(pa.binary(self.width), len(values), [None, pa.py_buffer(data.tobytes())])


class _SignedInteger(_FixedWidth):
    bits: ClassVar[int]

    def parse(self, text: str) -> int:
        try:
            return int(text)
        except ValueError:
            raise FormatError(f"{self.name} format expects an integer, got {text!r}") from None

    def coerce(self, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            else:
                raise FormatError(f"{self.name} format expects int, got {type(value).__name__} {value!r}")
        limit = 1 << (self.bits - 1)
        if not -limit <= value < limit:
            raise FormatError(f"{self.name} format holds {-limit}..{limit - 1}, got {value}")
        return value

    def byte_ranges(self, lower, upper, lower_inclusive=True, upper_inclusive=True):
        # Two's complement big-endian puts negatives (0x80..) after non-negatives (0x00..):
        # scan the negative part first, then the non-negative part, each in byte order.
        limit = 1 << (self.bits - 1)
        if lower is not None and not lower_inclusive:
            if lower >= limit - 1:
                return []
            lower, lower_inclusive = lower + 1, True
        if upper is not None and not upper_inclusive:
            if upper <= -limit:
                return []
            upper, upper_inclusive = upper - 1, True
        ranges: list[ByteRange] = []
        if lower is not None and upper is not None and lower > upper:
            return ranges
        if lower is None or lower < 0:
            neg_hi = -1 if upper is None else min(upper, -1)
            start = b"\x80" + b"\x00" * (self.width - 1) if lower is None else self.serialize(lower)
            ranges.append(ByteRange(start, _after(self.serialize(neg_hi))))
        if upper is None or upper >= 0:
            start = b"\x00" * self.width if lower is None else self.serialize(max(lower, 0))
            stop = b"\x80" if upper is None else _after(self.serialize(upper))
            ranges.append(ByteRange(start, stop))
        return ranges


class LongFormat(_SignedInteger):
    name = "long"
    arrow_type = pa.int64()
    code = "q"
    width = 8
    bits = 64


class IntFormat(_SignedInteger):
    name = "int"
    arrow_type = pa.int32()
    code = "i"
    width = 4
    bits = 32


class DoubleFormat(_FixedWidth):
    name = "double"
    arrow_type = pa.float64()
    code = "d"
    width = 8

    def parse(self, text: str) -> float:
        try:
            return float(text)
        except ValueError:
            raise FormatError(f"double format expects a number, got {text!r}") from None

    def coerce(self, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise FormatError(f"double format expects a number, got {type(value).__name__} {value!r}")
        return float(value)

    def byte_ranges(self, lower, upper, lower_inclusive=True, upper_inclusive=True):
        # IEEE 754 bytes: non-negatives (sign bit clear) sort in value order; negatives, -0.0
        # included, sort in reverse (bigger magnitude, bigger bytes), so that part is scanned
        # backwards. -0.0 and 0.0 are equal values, so each side decides about zero on its own.
        if lower is not None and upper is not None and (
            lower > upper or (lower == upper and not (lower_inclusive and upper_inclusive))
        ):
            return []
        enc = self.serialize
        ranges: list[ByteRange] = []
        # negative side: bytes from the value nearest zero (upper) to the most negative (lower)
        neg_start: bytes | None
        if upper is None or upper > 0 or (upper == 0 and upper_inclusive):
            neg_start = enc(-0.0)
        elif upper == 0:
            neg_start = _after(enc(-0.0))
        else:
            neg_start = enc(upper) if upper_inclusive else _after(enc(upper))
        neg_stop: bytes | None
        if lower is None:
            neg_stop = None
        elif lower < 0:
            neg_stop = _after(enc(lower)) if lower_inclusive else enc(lower)
        elif lower == 0 and lower_inclusive:
            neg_stop = _after(enc(-0.0))
        else:
            neg_stop = b""  # nothing negative qualifies
        if neg_stop is None or neg_start < neg_stop:
            ranges.append(ByteRange(neg_start, neg_stop, reverse=True))
        # non-negative side
        if lower is None or lower < 0 or (lower == 0 and lower_inclusive):
            pos_start = enc(0.0)
        elif lower == 0:
            pos_start = _after(enc(0.0))
        else:
            pos_start = enc(lower) if lower_inclusive else _after(enc(lower))
        if upper is None:
            pos_stop = b"\x80"  # every non-negative double starts below 0x80
        elif upper > 0:
            pos_stop = _after(enc(upper)) if upper_inclusive else enc(upper)
        elif upper == 0 and upper_inclusive:
            pos_stop = _after(enc(0.0))
        else:
            pos_stop = b""
        if pos_start < pos_stop:
            ranges.append(ByteRange(pos_start, pos_stop))
        return ranges


# JSON record fields: declared type -> (Arrow type, coercion of a decoded JSON value)
def _to_int(bits: int) -> Callable[[Any], int | None]:
    limit = 1 << (bits - 1)

    def convert(v: Any) -> int | None:
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not v.is_integer()):
            raise FormatError(f"expected an integer, got {v!r}")
        if not -limit <= int(v) < limit:
            raise FormatError(f"{v} does not fit in {bits} bits")
        return int(v)

    return convert


def _to_float(v: Any) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise FormatError(f"expected a number, got {v!r}")
    return float(v)


def _to_str(v: Any) -> str | None:
    if v is None or isinstance(v, str):
        return v
    raise FormatError(f"expected a string, got {v!r}")


def _to_bool(v: Any) -> bool | None:
    if v is None or isinstance(v, bool):
        return v
    raise FormatError(f"expected true or false, got {v!r}")


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


def _to_millis(v: Any) -> int | None:
    """Timestamps travel as epoch milliseconds; ISO-8601 strings and datetimes are accepted too."""
    if v is None:
        return None
    if isinstance(v, dt.datetime):
        if v.tzinfo is None:
            v = v.replace(tzinfo=dt.timezone.utc)
        return (v - _EPOCH) // dt.timedelta(milliseconds=1)
    if isinstance(v, str):
        try:
            return _to_millis(dt.datetime.fromisoformat(v.replace("Z", "+00:00")))
        except ValueError:
            raise FormatError(f"expected epoch milliseconds or an ISO-8601 time, got {v!r}") from None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not math.isfinite(v)):
        raise FormatError(f"expected epoch milliseconds or an ISO-8601 time, got {v!r}")
    return int(v)


TIMESTAMP = pa.timestamp("ms", tz="UTC")

JSON_FIELD_TYPES: dict[str, tuple[pa.DataType, Callable[[Any], Any]]] = {
    "string": (pa.string(), _to_str),
    "long": (pa.int64(), _to_int(64)),
    "int": (pa.int32(), _to_int(32)),
    "double": (pa.float64(), _to_float),
    "boolean": (pa.bool_(), _to_bool),
    "timestamp": (TIMESTAMP, _to_millis),
}


class JsonFormat(Format):
    """A UTF-8 JSON object with declared fields; each field is its own column (missing = null)."""

    name = "json"
    arrow_type = pa.struct([])
    key_capable = False
    takes_fields = True

    def __init__(self, fields: Sequence[tuple[str, str]] = ()):
        unknown = [t for _, t in fields if t not in JSON_FIELD_TYPES]
        if unknown:
            raise FormatError(f"json field type {unknown[0]!r} is not one of {', '.join(JSON_FIELD_TYPES)}")
        self.fields = list(fields)
        self._converters = [(n, JSON_FIELD_TYPES[t][1]) for n, t in self.fields]
        self.arrow_type = pa.struct([pa.field(n, JSON_FIELD_TYPES[t][0]) for n, t in self.fields])

    def with_fields(self, fields: Sequence[tuple[str, str]]) -> JsonFormat:
        return JsonFormat(fields)

    def coerce(self, value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise FormatError(f"json format expects an object (dict), got {type(value).__name__}")
        out = {}
        for name, convert in self._converters:
            try:
                out[name] = convert(value.get(name))
            except FormatError as e:
                raise FormatError(f"json field {name!r}: {e}") from None
        return out

    def serialize(self, value: Any) -> bytes:
        return json.dumps(self.coerce(value), separators=(",", ":")).encode("utf-8")

    def deserialize(self, data: bytes) -> dict[str, Any]:
        try:
            obj = json.loads(data)
        except ValueError as e:
            raise FormatError(f"json format: not valid JSON ({e})") from None
        return self.coerce(obj)

    def parse(self, text: str) -> dict[str, Any]:
        return self.deserialize(text.encode("utf-8"))

    def decode_columns(self, data: Sequence[bytes]) -> list[pa.Array]:
        """One Arrow array per declared field."""
        rows = [self.deserialize(d) for d in data]
        return [
            pa.array([r[name] for r in rows], self.arrow_type.field(i).type)
            for i, (name, _) in enumerate(self.fields)
        ]

    def decode_many(self, data: Sequence[bytes]) -> pa.Array:
        return pa.StructArray.from_arrays(self.decode_columns(data), fields=list(self.arrow_type))
