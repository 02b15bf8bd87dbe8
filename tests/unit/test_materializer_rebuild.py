"""A shard rebuilt because its offset left the log's range (OFFSET_OUT_OF_RANGE) never claims
records it lacks: records of that partition fetched before the error, in the same batch, belong
to the log it is rebuilding from, not to the emptied shard."""

from __future__ import annotations

from confluent_kafka import KafkaError

from federator.catalog import StoreDefinition
from federator.node.materializer import ACTIVE, HostedShard, Materializer
from federator.query import RangeQuery
from federator.store.shard import Shard
from tests.registry import REGISTRY

TOPIC = "app-s-changelog"


class Message:
    def __init__(self, offset: int, key: bytes = b"", error: KafkaError | None = None) -> None:
        self._offset, self._key, self._error = offset, key, error

    def error(self) -> KafkaError | None:
        return self._error

    def topic(self) -> str:
        return TOPIC

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes:
        return self._key

    def value(self) -> bytes:
        return self._key.upper()

    def timestamp(self) -> tuple[int, int]:
        return 1, 1_000


class Consumer:
    """What the materializer asks of its consumer: one batch of messages, then assignments."""

    def __init__(self, batch: list[Message]) -> None:
        self.batch, self.assigned = batch, []

    def poll(self, timeout: float) -> Message | None:
        return self.batch.pop(0) if self.batch else None

    def consume(self, n: int, timeout: float) -> list[Message]:
        out, self.batch = self.batch[:n], self.batch[n:]
        return out

    def assign(self, partitions) -> None:
        self.assigned.append([(tp.topic, tp.partition, tp.offset) for tp in partitions])

    def get_watermark_offsets(self, tp, cached: bool = False) -> tuple[int, int]:
        return 0, 3


def test_records_fetched_before_an_offset_reset_are_not_applied_to_the_emptied_shard(tmp_path) -> None:
    defn = StoreDefinition.from_dict({"name": "s", "type": "kv", "topic": TOPIC, "partitions": 1,
                                      "key": {"format": "bytes"}, "value": {"format": "bytes"}}, REGISTRY)
    shard = Shard(tmp_path / "s", defn, 0)
    m = Materializer("unused:9092", tmp_path, fetch_wait_ms=10)
    m._hosted[("s", 0)] = hs = HostedShard(shard, ACTIVE, restored=True, caught_up=True)
    m._consume(Consumer([Message(0, b"alpha")]))
    assert shard.offset == 0

    # offsets 1 and 2 arrive, then the broker says the next offset is out of the log's range
    # (its start moved past it): the shard is emptied and read again from the log's start,
    # and an end-of-partition event already queued must not make it current meanwhile
    reset = KafkaError(KafkaError._AUTO_OFFSET_RESET)
    eof = KafkaError(KafkaError._PARTITION_EOF)
    consumer = Consumer([Message(1, b"b"), Message(2, b"c"), Message(3, error=reset), Message(3, error=eof)])
    m._consume(consumer)
    rows = shard.query(RangeQuery())[0].num_rows
    assert shard.offset is None and rows == 0, (shard.offset, rows)  # empty, claiming nothing
    assert not hs.restored
    assert consumer.assigned[-1] == [(TOPIC, 0, -2)]  # from the beginning (OFFSET_BEGINNING)
    shard.close()
