"""Building Arrow batches from stored entries: the vectorized path (many entries) gives exactly
what decoding each value in Python gives, for every format, and refuses corrupt entries."""

from __future__ import annotations

import struct

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from federator.catalog import StoreDefinition
from federator.formats import FormatError
from federator.store.arrow import build_batch, split_stored
from tests.registry import REGISTRY

FAST = settings(max_examples=20, deadline=None)

VALUES = {
    "long": st.integers(-(1 << 63), (1 << 63) - 1),
    "int": st.integers(-(1 << 31), (1 << 31) - 1),
    "double": st.floats(allow_nan=False),
    "string": st.text(max_size=6),
    "bytes": st.binary(max_size=6),
}
ROWTIMES = st.integers(-(1 << 50), 1 << 50)


def _kv(key: str, value: str) -> StoreDefinition:
    return StoreDefinition.from_dict({"name": "s", "type": "kv", "topic": "s", "partitions": 1,
                                      "key": {"format": key}, "value": {"format": value}}, REGISTRY)


def _python_batch(defn: StoreDefinition, keys: list[bytes], stored: list[bytes]) -> pa.RecordBatch:
    schema = REGISTRY.store_type("kv").schema(defn)
    cols = [pa.array([defn.key.deserialize(k) for k in keys], defn.key.arrow_type),
            pa.array([defn.value.deserialize(v[8:]) for v in stored], defn.value.arrow_type),
            pa.array([struct.unpack(">q", v[:8])[0] for v in stored], pa.int64()).cast(schema.field(2).type)]
    return pa.RecordBatch.from_arrays(cols, schema=schema)


@pytest.mark.parametrize("value_format", sorted(VALUES))
@FAST
@given(data=st.data(), n=st.sampled_from([0, 3, 64, 200]))
def test_many_entries_decode_like_one_at_a_time(value_format: str, data, n: int) -> None:
    defn = _kv("long", value_format)
    keys = sorted({defn.key.serialize(k) for k in data.draw(st.lists(VALUES["long"], min_size=n, max_size=n))})
    stored = [struct.pack(">q", data.draw(ROWTIMES)) + defn.value.serialize(data.draw(VALUES[value_format]))
              for _ in keys]
    got = build_batch(REGISTRY.store_type("kv").schema(defn), defn, keys, stored)
    assert got.equals(_python_batch(defn, keys, stored))


def test_split_works_on_a_slice_of_a_larger_array() -> None:
    stored = [struct.pack(">q", i) + b"v" * (i % 3) for i in range(10)]
    times, values = split_stored(pa.array(stored, pa.binary()).slice(2, 5))
    assert times.cast(pa.int64()).to_pylist() == [2, 3, 4, 5, 6]
    assert values.to_pylist() == [b"v" * (i % 3) for i in range(2, 7)]


def test_a_fixed_width_value_of_the_wrong_size_is_named() -> None:
    defn = _kv("long", "long")
    keys = [defn.key.serialize(i) for i in range(100)]
    stored = [struct.pack(">qq", 0, i) for i in range(100)]
    stored[50] = struct.pack(">q", 0) + b"\x01\x02\x03"
    with pytest.raises(FormatError, match="long format expects 8 bytes, got 3"):
        build_batch(REGISTRY.store_type("kv").schema(defn), defn, keys, stored)


def test_an_entry_shorter_than_its_rowtime_is_refused() -> None:
    with pytest.raises(FormatError, match="fewer than its 8-byte rowtime"):
        split_stored(pa.array([b"\x00" * 8, b"\x00" * 3], pa.binary()))


def test_invalid_utf8_in_many_string_keys_is_refused() -> None:
    defn = _kv("string", "long")
    keys = [b"k%03d" % i for i in range(99)] + [b"\xff"]
    stored = [struct.pack(">qq", 0, i) for i in range(100)]
    with pytest.raises(pa.ArrowInvalid):
        build_batch(REGISTRY.store_type("kv").schema(defn), defn, keys, stored)


def test_json_values_decode_through_the_vector_path() -> None:
    defn = StoreDefinition.from_dict({"name": "s", "type": "kv", "topic": "s", "partitions": 1,
                                      "key": {"format": "long"},
                                      "value": {"format": "json", "fields": [{"name": "a", "type": "long"},
                                                                             {"name": "b", "type": "string"}]}}, REGISTRY)
    keys = [defn.key.serialize(i) for i in range(100)]
    stored = [struct.pack(">q", i) + defn.value.serialize({"a": i, "b": str(i)}) for i in range(100)]
    batch = build_batch(REGISTRY.store_type("kv").schema(defn), defn, keys, stored)
    assert batch.column(1).to_pylist() == list(range(100))
    assert batch.column(2).to_pylist() == [str(i) for i in range(100)]
