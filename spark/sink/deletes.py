"""Deleting on the driver: the keys a changelog holds live (replace mode reads them before a
write), the ones a write did not mark, and their tombstones, each in its plain key's partition."""

from __future__ import annotations

import time
from typing import Any, Sequence

import pyarrow as pa

from federator import kafka
from federator.catalog import StoreDefinition
from federator.store.layout import plain_key
from federator_spark.sink.partitioning import murmur2_partitions
from federator_spark.sink.producing import drop_driver_producer, driver_producer, produce_waiting


def live_keys(bootstrap: str, topic: str, partitions: int, timeout: float) -> set[bytes]:
    """Changelog keys whose latest record is not a tombstone, read to each partition's end
    (the fetch path's end-of-partition event: tansu's reported high watermark is wrong)."""
    from confluent_kafka import KafkaError, TopicPartition

    consumer = kafka.reader(bootstrap, **{"fetch.wait.max.ms": 5})  # read to the end once, not tailing
    live: dict[bytes, bool] = {}
    done: set[int] = set()
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        deadline = time.monotonic() + timeout
        while len(done) < partitions:
            if time.monotonic() > deadline:
                raise kafka.KafkaUnavailable(
                    f"reading {topic!r} to its end timed out after {timeout:.0f}s (partitions done: {sorted(done)})"
                )
            for m in kafka.next_batch(consumer, 10_000, 0.5):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        done.add(m.partition())
                        continue
                    raise kafka.KafkaUnavailable(f"reading {topic!r}: {err.str()}")
                k = m.key()
                if k is not None:
                    live[k] = m.value() is not None
    finally:
        consumer.close()
    return {k for k, alive in live.items() if alive}


def tombstones(bootstrap: str, defn: StoreDefinition, keys: Sequence[bytes], now_ms: int,
               timeout: float) -> dict[int, int]:
    """Delete ``keys`` (changelog keys); the last offset per partition."""
    layout = defn.store_type.changelog_layout
    parts = murmur2_partitions(pa.array([plain_key(layout, k) for k in keys], pa.binary()), defn.partitions)
    producer = driver_producer(bootstrap)
    try:
        return tombstones_with(producer, defn, keys, parts.to_pylist(), now_ms, timeout)
    except BaseException:
        drop_driver_producer(bootstrap, producer)
        raise


def tombstones_with(producer: Any, defn: StoreDefinition, keys: Sequence[bytes], parts: list[int],
                    now_ms: int, timeout: float) -> dict[int, int]:
    """Produce a tombstone (null value) for each changelog key to its partition; the last
    offset per partition."""
    reports: list[dict] = [{} for _ in range(defn.partitions)]
    for k, p in zip(keys, parts):
        try:
            producer.produce(defn.topic, None, k, p, reports[p].__setitem__, None, now_ms)
        except BufferError:
            produce_waiting(producer, defn.topic, None, k, p, reports[p].__setitem__, None, now_ms)
    if producer.flush(timeout):
        raise kafka.KafkaUnavailable(f"tombstones to {defn.topic!r} were not delivered within {timeout:.0f}s")
    out = {}
    for p, d in enumerate(reports):
        errors = [e for e in d if e is not None]
        if errors:
            raise kafka.KafkaUnavailable(f"deleting keys in {defn.topic}[{p}] failed: {errors[0].str()}")
        if d.get(None) is not None:
            out[p] = d[None].offset()
    return out


def unmarked(keys: list[bytes], bitmap: int) -> list[bytes]:
    """The keys whose bit is not set."""
    raw = bitmap.to_bytes((len(keys) + 7) // 8, "little")
    out = []
    for byte_index, b in enumerate(raw):
        if b != 0xFF:
            for bit in range(8):
                i = byte_index * 8 + bit
                if i < len(keys) and not (b >> bit) & 1:
                    out.append(keys[i])
    return out
