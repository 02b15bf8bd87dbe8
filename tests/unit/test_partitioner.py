"""Kafka's default partitioner: murmur2 and toPositive(murmur2(key)) % partitions."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from federator.partitioner import murmur2, partition_for

# Apache Kafka, clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java (testMurmur2)
KAFKA_VECTORS = [
    ("21", -973932308),
    ("foobar", -790332482),
    ("a-little-bit-long-string", -985981536),
    ("a-little-bit-longer-string", -1486304829),
    ("lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    ("abc", 479470107),
]

# librdkafka src/rdmurmur2.c unittest_murmur2 (java_murmur2_results); these cover
# every length % 4, including 1 ("kafka", "4") which Kafka's own vectors miss.
LIBRDKAFKA_VECTORS = [
    ("kafka", 0xD067CF64),
    ("giberish123456789", 0x8F552B0C),
    ("1234", 0x9FC97B14),
    ("234", 0xE7C009CA),
    ("34", 0x873930DA),
    ("4", 0x5A4B5CA1),
    ("PreAmbleWillBeRemoved,ThePrePartThatIs", 0x78424F1C),
    ("reAmbleWillBeRemoved,ThePrePartThatIs", 0x4A62B377),
    ("eAmbleWillBeRemoved,ThePrePartThatIs", 0xE0E4E09E),
    ("AmbleWillBeRemoved,ThePrePartThatIs", 0x62B8B43F),
    ("", 0x106E08D9),
]


def _signed(u: int) -> int:
    return u - (1 << 32) if u & 0x80000000 else u


@pytest.mark.parametrize(("key", "expected"), KAFKA_VECTORS)
def test_murmur2_matches_kafka_java_vectors(key: str, expected: int) -> None:
    assert murmur2(key.encode("utf-8")) == expected


@pytest.mark.parametrize(("key", "expected"), LIBRDKAFKA_VECTORS)
def test_murmur2_matches_librdkafka_vectors(key: str, expected: int) -> None:
    assert murmur2(key.encode("utf-8")) == _signed(expected)


@settings(max_examples=200)
@given(st.binary(max_size=64))
def test_murmur2_is_a_signed_32_bit_int(data: bytes) -> None:
    h = murmur2(data)
    assert isinstance(h, int)
    assert -(1 << 31) <= h < (1 << 31)
    assert murmur2(bytes(data)) == h


def test_partition_for_clears_the_sign_bit_rather_than_taking_abs() -> None:
    # murmur2("foobar") = -790332482; toPositive gives 1357151166 (abs would give 790332482)
    assert partition_for(b"foobar", 1000) == 1357151166 % 1000 == 166
    # murmur2("21") = -973932308 -> toPositive 1173551340
    assert partition_for(b"21", 1000) == 1173551340 % 1000 == 340
    # murmur2("abc") = 479470107 is already positive
    assert partition_for(b"abc", 1000) == 479470107 % 1000 == 107


@settings(max_examples=200)
@given(st.binary(max_size=64), st.integers(min_value=1, max_value=10_000))
def test_partition_for_is_in_range_and_deterministic(key: bytes, partitions: int) -> None:
    p = partition_for(key, partitions)
    assert 0 <= p < partitions
    assert partition_for(key, partitions) == p
    assert p == (murmur2(key) & 0x7FFFFFFF) % partitions


@settings(max_examples=50)
@given(st.binary(max_size=32))
def test_single_partition_always_zero(key: bytes) -> None:
    assert partition_for(key, 1) == 0


def test_partition_for_spreads_keys() -> None:
    used = {partition_for(f"key-{i}".encode(), 8) for i in range(200)}
    assert used == set(range(8))


@pytest.mark.parametrize("partitions", [0, -1, -100])
def test_partition_for_rejects_fewer_than_one_partition(partitions: int) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        partition_for(b"k", partitions)
