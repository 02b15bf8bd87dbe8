"""Kafka's default partitioner, so every component agrees on where a key lives.

This is the Java client's ``Utils.murmur2`` and ``toPositive(murmur2(key)) % partitions``;
librdkafka's ``murmur2_random`` partitioner computes the same for non-null keys. The hash is
MurmurHash2 with Kafka's seed, computed in native code (the murmurhash2 package): a loop of
Python cost about 200 opcodes a key, and a rank or a point read hashes the keys it is asked.
"""

from __future__ import annotations

from murmurhash2 import murmurhash2

_SEED = 0x9747B28C  # Kafka's


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 hash of ``data`` as a signed 32-bit int."""
    h = murmurhash2(bytes(data), _SEED)
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner picks for ``key`` among ``partitions``."""
    if partitions < 1:
        raise ValueError(f"partitions must be at least 1, got {partitions}")
    if type(key) is not bytes:  # a plugin format's bytearray or memoryview
        key = bytes(key)
    return (murmurhash2(key, _SEED) & 0x7FFFFFFF) % partitions
