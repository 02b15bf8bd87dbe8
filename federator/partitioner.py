"""Kafka's default partitioner, so every component agrees on where a key lives.

This is the Java client's ``Utils.murmur2`` and ``toPositive(murmur2(key)) % partitions``;
librdkafka's ``murmur2_random`` partitioner computes the same for non-null keys.
"""

from __future__ import annotations

import functools

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 hash of ``data`` as a signed 32-bit int (seed 0x9747b28c)."""
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    end = length - (length & 3)
    for i in range(0, end, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    rest = length & 3
    if rest == 3:
        h ^= data[end + 2] << 16
    if rest >= 2:
        h ^= data[end + 1] << 8
    if rest >= 1:
        h ^= data[end]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner picks for ``key`` among ``partitions``."""
    try:
        return _partition_of(key, partitions)
    except TypeError:  # a buffer that cannot be a cache key (a plugin format's bytearray)
        return _partition_of(bytes(key), partitions)


# Kept for the keys asked most (a point query's, a player's rank): the hash is a loop of
# Python, about 200 opcodes a key, and the same keys are asked again and again.
@functools.lru_cache(maxsize=16384)
def _partition_of(key: bytes, partitions: int) -> int:
    if partitions < 1:
        raise ValueError(f"partitions must be at least 1, got {partitions}")
    return (murmur2(key) & 0x7FFFFFFF) % partitions
