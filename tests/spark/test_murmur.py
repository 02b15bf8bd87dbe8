"""The sink's vectorized murmur2 puts every key where federator.partitioner does."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from federator.partitioner import partition_for
from federator_spark.sink import murmur2_partitions
from federator_spark.sink.encoding import encode
from tests.registry import REGISTRY


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=40), min_size=1, max_size=60), st.integers(1, 100), st.integers(0, 3))
def test_binary_keys(keys, partitions, cut):
    arr = pa.array(keys, pa.binary())
    if cut and len(keys) > cut:  # a slice: offsets that do not start at zero
        arr, keys = arr.slice(cut), keys[cut:]
    assert murmur2_partitions(arr, partitions).to_pylist() == [partition_for(k, partitions) for k in keys]


@pytest.mark.parametrize("fmt", ["long", "int", "double", "string"])
def test_serialized_keys(fmt):
    rnd = random.Random(fmt)
    values = {
        "long": lambda: rnd.randint(-(2 ** 63), 2 ** 63 - 1),
        "int": lambda: rnd.randint(-(2 ** 31), 2 ** 31 - 1),
        "double": lambda: rnd.uniform(-1e12, 1e12),
        "string": lambda: "".join(rnd.choice("aé✓z0 ") for _ in range(rnd.randint(0, 12))),
    }[fmt]
    vals = [values() for _ in range(2000)]
    f = REGISTRY.format(fmt)
    ser = encode(pa.array(vals), f)
    assert ser.to_pylist() == [f.serialize(v) for v in vals]
    assert murmur2_partitions(ser, 8).to_pylist() == [partition_for(f.serialize(v), 8) for v in vals]


def test_empty_batch():
    assert murmur2_partitions(pa.array([], pa.binary()), 8).to_pylist() == []
