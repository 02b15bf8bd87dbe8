"""Reading a store partition's changelog into its shard."""

from __future__ import annotations

import time
from typing import Callable, Iterable

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, TopicPartition

from federator import kafka
from federator.store.record import ChangelogRecord
from federator.store.shard import Shard


def to_records(messages: Iterable[Message]) -> list[ChangelogRecord]:
    return [ChangelogRecord(m.key() or b"", m.value(), m.offset(), m.timestamp()[1]) for m in messages]


def catch_up(
    shard: Shard,
    bootstrap_servers: str,
    *,
    batch_size: int = 2000,
    timeout: float = 60.0,
    consumer: Consumer | None = None,
    on_batch: Callable[[int], None] | None = None,
) -> int:
    """Apply the changelog from the shard's position to the current end; returns records applied.

    A shard whose recorded offset the topic no longer has (truncated, deleted, the broker
    restarted empty) is emptied and rebuilt from the beginning, never served as current.
    """
    current = kafka.topic_id(kafka.admin(bootstrap_servers), shard.topic)
    if current is None:
        raise kafka.KafkaUnavailable(f"changelog topic {shard.topic!r} does not exist")
    # Some brokers (tansu among them) never answer OFFSET_OUT_OF_RANGE for a topic created
    # anew; its new id tells us instead.
    shard.set_source(current)
    own = consumer is None
    consumer = consumer or kafka.reader(bootstrap_servers, **{"auto.offset.reset": "error"})
    applied = 0
    try:
        start = shard.offset
        consumer.assign([TopicPartition(shard.topic, shard.partition, OFFSET_BEGINNING if start is None else start + 1)])
        deadline = time.monotonic() + timeout
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"catching up {shard.topic}[{shard.partition}] took over {timeout:.0f}s ({applied} records applied)"
                )
            messages = kafka.next_batch(consumer, batch_size, 0.5)
            data = [m for m in messages if not m.error()]
            if data:
                shard.apply(to_records(data))
                applied += len(data)
                if on_batch:
                    on_batch(len(data))
            for m in messages:
                err = m.error()
                if err is None:
                    continue
                if err.code() == KafkaError._PARTITION_EOF:
                    shard.apply([], through=m.offset() - 1)  # offsets without data (commit markers) too
                    return applied
                if err.code() == KafkaError._AUTO_OFFSET_RESET:
                    shard.reset()
                    consumer.assign([TopicPartition(shard.topic, shard.partition, OFFSET_BEGINNING)])
                    break
                raise kafka.KafkaUnavailable(f"reading {shard.topic}[{shard.partition}]: {err.str()}")
    finally:
        if own:
            consumer.close()
