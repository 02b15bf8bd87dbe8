"""What the materializer applies from one fetched batch: records the consumer hands over that do
not follow the shard's position (fetched before it moved, or from a log the broker has since
said is out of range) never reach the shard; and where a new shard starts reading. Real shards
on RocksDB; the consumer is a fake that hands over the batches a librdkafka consumer can."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition

from federator.catalog import StoreDefinition
from federator.node.materializer import ACTIVE, HostedShard, Materializer
from federator.query import RangeQuery
from federator.store import ChangelogRecord, Shard
from tests.registry import REGISTRY

TOPIC = "app-s-changelog"


@dataclass
class Message:
    """A consumed record, or an error event (``code``), as confluent-kafka hands them over."""

    partition_: int
    offset_: int
    key_: bytes = b""
    value_: bytes | None = None
    code: int | None = None

    def error(self) -> KafkaError | None:
        return None if self.code is None else KafkaError(self.code)

    def topic(self) -> str:
        return TOPIC

    def partition(self) -> int:
        return self.partition_

    def offset(self) -> int:
        return self.offset_

    def key(self) -> bytes:
        return self.key_

    def value(self) -> bytes | None:
        return self.value_

    def timestamp(self) -> tuple[int, int]:
        return 1, 0


@dataclass
class Consumer:
    """Hands over the queued batches one poll at a time; records what it was assigned."""

    batches: list[list[Message]]
    assigned: list[list[tuple[int, int]]] = field(default_factory=list)
    high: int = -1  # the log end the last fetch saw (-1: not known)

    def poll(self, timeout: float) -> Message | None:
        return self.batches[0].pop(0) if self.batches and self.batches[0] else None

    def consume(self, n: int, timeout: float) -> list[Message]:
        return self.batches.pop(0) if self.batches else []

    def assign(self, tps: list[TopicPartition]) -> None:
        self.assigned.append([(tp.partition, tp.offset) for tp in tps])

    def get_watermark_offsets(self, tp: TopicPartition, cached: bool = False) -> tuple[int, int]:
        return -1, self.high


def record(offset: int, key: str, value: str = "v") -> Message:
    return Message(0, offset, key.encode(), value.encode())


def materializer(tmp_path: Path) -> tuple[Materializer, Shard]:
    m, (shard,) = materializer_of(tmp_path, 1)
    return m, shard


def materializer_of(tmp_path: Path, partitions: int) -> tuple[Materializer, list[Shard]]:
    """A materializer hosting every partition of store ``s`` (string -> string), and its shards."""
    defn = StoreDefinition.from_dict({"name": "s", "type": "kv", "topic": TOPIC, "partitions": partitions,
                                      "key": {"format": "string"}, "value": {"format": "string"}}, REGISTRY)
    m = Materializer("unused:9092", tmp_path, fetch_wait_ms=10)
    shards = [Shard(tmp_path / "s" / str(p), defn, p) for p in range(partitions)]
    for shard in shards:
        m._hosted[("s", shard.partition)] = HostedShard(shard, ACTIVE)
    return m, shards


def contents(shard: Shard) -> dict[str, str]:
    r = shard.run(RangeQuery())
    assert r.ok, r
    return dict(zip(r.batch.column("key").to_pylist(), r.batch.column("value").to_pylist()))


def test_records_fetched_before_an_out_of_range_answer_are_not_applied_to_the_rebuilt_shard(tmp_path) -> None:
    """The broker's log was truncated or created anew under the shard (at offset 2): the batch
    holds the old log's next records and then the out-of-range answer. The rebuilt shard
    starts from the log's beginning, empty, and holds what the log holds now."""
    m, shard = materializer(tmp_path)
    shard.apply([ChangelogRecord(f"old{i}".encode(), b"v", i, 1) for i in range(3)])
    consumer = Consumer([
        [record(3, "old3"), record(4, "old4"), Message(0, 5, code=KafkaError._AUTO_OFFSET_RESET)],
    ])
    m._consume(consumer)
    assert (shard.offset, contents(shard)) == (None, {})
    assert consumer.assigned[-1] == [(0, OFFSET_BEGINNING)]
    # a reassignment before the log was read again (a rebalance, a store added) starts there too,
    # not past records the rebuilt shard never had
    m._assign(consumer)
    assert consumer.assigned[-1] == [(0, OFFSET_BEGINNING)]
    consumer.batches.append([record(0, "alpha", "A"), record(1, "b"), Message(0, 2, code=KafkaError._PARTITION_EOF)])
    m._consume(consumer)
    assert (shard.offset, contents(shard)) == (1, {"alpha": "A", "b": "v"})
    assert m.hosted("s", 0).restored


def test_records_polled_when_applying_them_failed_are_read_again(tmp_path) -> None:
    """A fetch whose apply failed (a disk error): the next step reads its records again from
    past what the shard holds, rather than going on past them."""
    m, shard = materializer(tmp_path)
    consumer = Consumer([[record(0, "a"), record(1, "b")]])
    apply = shard.apply

    def fail_once(*args, **kwargs):
        shard.apply = apply
        raise OSError("No space left on device")

    shard.apply = fail_once
    with pytest.raises(OSError):
        m._step(consumer, None, float("inf"))
    consumer.batches = [[record(0, "a"), record(1, "b")]]
    m._step(consumer, None, float("inf"))
    assert consumer.assigned[-1] == [(0, 0)]
    assert (shard.offset, contents(shard)) == (1, {"a": "v", "b": "v"})


def test_records_at_or_before_the_shards_position_do_not_take_it_back(tmp_path) -> None:
    """Records handed over at or before the shard's position (fetched before it last moved)
    leave the shard as it was; what follows is applied."""
    m, shard = materializer(tmp_path)
    shard.apply([record_of(0, "k", "old"), record_of(1, "k", "new"), record_of(2, "j", "x")])
    m._consume(Consumer([[record(0, "k", "old")]]))
    assert (shard.offset, contents(shard)) == (2, {"k": "new", "j": "x"})
    m._consume(Consumer([[record(1, "k", "new"), record(2, "j", "x"), record(3, "i", "y")]]))
    assert (shard.offset, contents(shard)) == (3, {"k": "new", "j": "x", "i": "y"})


def record_of(offset: int, key: str, value: str) -> ChangelogRecord:
    return ChangelogRecord(key.encode(), value.encode(), offset, 1)


def test_a_copy_at_the_log_end_the_fetch_saw_is_current_without_an_end_of_partition_event(tmp_path) -> None:
    """A log written to all the time may give no end-of-partition event for seconds; a copy (a
    standby promoted after a node died) whose records reach the end the fetch reported is
    current then, not only at the next event."""
    m, shard = materializer(tmp_path)
    m._consume(Consumer([[record(0, "a"), record(1, "b")]], high=5))
    assert not m.hosted("s", 0).restored  # behind the end: restoring
    m._consume(Consumer([[record(2, "c"), record(3, "d"), record(4, "e")]], high=5))
    assert m.hosted("s", 0).restored and m.hosted("s", 0).caught_up


@dataclass
class LogConsumer:
    """A consumer of one partition's log as a broker serves it: ``first`` is the log's first
    offset (the records before it deleted), ``answered_start`` what the broker answers when
    asked where the log starts (OFFSET_BEGINNING). Each assignment queues what a fetch from
    there gives: the records and the end of the partition, or the out-of-range answer."""

    records: list[Message]
    first: int = 0
    answered_start: int = 0
    assigned: list[list[tuple[int, int]]] = field(default_factory=list)
    queued: list[Message] = field(default_factory=list)

    def assign(self, tps: list[TopicPartition]) -> None:
        self.assigned.append([(tp.partition, tp.offset) for tp in tps])
        (tp,) = tps
        start = self.answered_start if tp.offset == OFFSET_BEGINNING else tp.offset
        end = self.records[-1].offset_ + 1
        self.queued = ([Message(0, start, code=KafkaError._AUTO_OFFSET_RESET)] if start < self.first else
                       [m for m in self.records if m.offset_ >= start] + [Message(0, end, code=KafkaError._PARTITION_EOF)])

    def poll(self, timeout: float) -> Message | None:
        return self.queued.pop(0) if self.queued else None

    def consume(self, n: int, timeout: float) -> list[Message]:
        out, self.queued = self.queued, []
        return out

    def get_watermark_offsets(self, tp: TopicPartition, cached: bool = False) -> tuple[int, int]:
        return self.first, self.records[-1].offset_ + 1


def test_a_new_shard_gets_every_record_when_the_brokers_log_start_answer_is_past_the_first(tmp_path) -> None:
    """tansu answers where a log starts with the offset of the batch it stored first, and two
    producers' batches can be stored in the other order than their offsets: here the batch at
    offset 1 was stored before the one at 0. A new shard still holds all of the log."""
    m, shard = materializer(tmp_path)
    consumer = LogConsumer([record(0, "alpha", "A"), record(1, "b"), record(2, "c")], answered_start=1)
    m._assign(consumer)
    m._consume(consumer)
    assert (shard.offset, contents(shard)) == (2, {"alpha": "A", "b": "v", "c": "v"})
    assert m.hosted("s", 0).restored


def test_a_new_shard_reads_a_log_whose_start_moved_on_from_where_it_starts(tmp_path) -> None:
    """Records 0 and 1 were deleted (retention, DeleteRecords): offset 0 is out of range, and the
    shard then reads from the log's start, once."""
    m, shard = materializer(tmp_path)
    consumer = LogConsumer([record(2, "c"), record(3, "d")], first=2, answered_start=2)
    m._assign(consumer)
    m._consume(consumer)  # the out-of-range answer
    m._consume(consumer)
    assert (shard.offset, contents(shard)) == (3, {"c": "v", "d": "v"})
    assert consumer.assigned == [[(0, 0)], [(0, OFFSET_BEGINNING)]]
    m._assign(consumer)  # a later reassignment (a rebalance) goes on past what it holds
    assert consumer.assigned[-1] == [(0, 4)]
