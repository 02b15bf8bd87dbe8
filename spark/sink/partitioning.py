"""Kafka's murmur2 partitioner over a whole Arrow column of keys at once (numpy):
``federator.partitioner.partition_for`` for a batch."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

_M = 0x5BD1E995
_SEED = 0x9747B28C


def _murmur2_uniform(data: pa.Buffer | None, start: int, length: int, n: int) -> Any:
    """murmur2 (uint32 numpy array) of ``n`` keys of ``length`` bytes each, stored back to back
    in ``data`` from byte ``start``. uint32 arithmetic wraps modulo 2**32, as Java's int does."""
    import numpy as np

    m = np.uint32(_M)
    h = np.full(n, (_SEED ^ length) & 0xFFFFFFFF, dtype=np.uint32)
    if length:
        rows = np.frombuffer(data, dtype=np.uint8, count=n * length, offset=start).reshape(n, length)
        end = length - (length & 3)
        # the 4-byte words (little-endian, as murmur2 reads them), one column per word
        words = np.ascontiguousarray(rows[:, :end]).view("<u4") if end else None
        for i in range(end // 4):
            k = words[:, i] * m
            k ^= k >> np.uint32(24)
            k *= m
            h *= m
            h ^= k
        rest = length & 3
        if rest == 3:
            h ^= rows[:, end + 2].astype(np.uint32) << np.uint32(16)
        if rest >= 2:
            h ^= rows[:, end + 1].astype(np.uint32) << np.uint32(8)
        if rest >= 1:
            h ^= rows[:, end].astype(np.uint32)
            h *= m
    h ^= h >> np.uint32(13)
    h *= m
    h ^= h >> np.uint32(15)
    return h


def _binary_start(arr: pa.Array) -> int:
    """Byte position of the first value of a (possibly sliced) binary array in its data buffer."""
    offsets = pa.Array.from_buffers(pa.int32(), len(arr) + 1, [None, arr.buffers()[1]], offset=arr.offset)
    return offsets[0].as_py()


def murmur2_partitions(keys: pa.Array, partitions: int) -> pa.Array:
    """``(murmur2(key) & 0x7fffffff) % partitions`` for every key (no nulls), as int32:
    ``federator.partitioner.partition_for`` for a whole batch at once."""
    import numpy as np

    n = len(keys)
    if n == 0:
        return pa.array([], pa.int32())
    if pa.types.is_fixed_size_binary(keys.type):
        width = keys.type.byte_width
        h = _murmur2_uniform(keys.buffers()[1], keys.offset * width, width, n)
    else:
        if keys.type != pa.binary():
            keys = keys.cast(pa.binary())
        lengths = pc.binary_length(keys)
        mm = pc.min_max(lengths).as_py()
        if mm["min"] == mm["max"]:
            h = _murmur2_uniform(keys.buffers()[2], _binary_start(keys), mm["min"], n)
        else:  # one pass per key length, then back into row order
            h = np.empty(n, dtype=np.uint32)
            for length in pc.unique(lengths).to_pylist():
                idx = pc.indices_nonzero(pc.equal(lengths, length))
                sub = keys.take(idx)
                h[idx.to_numpy()] = _murmur2_uniform(sub.buffers()[2], _binary_start(sub), length, len(sub))
    return pa.array(((h & np.uint32(0x7FFFFFFF)) % np.uint32(partitions)).astype(np.int32))
