"""Helpers for tests that write changelogs and read them back."""

from __future__ import annotations

from confluent_kafka import KafkaError, TopicPartition

from federator import kafka
from federator.catalog import Catalog, StoreDefinition
from federator.partitioner import partition_for
from tests.registry import REGISTRY


def register(broker, app_id: str, d: dict) -> StoreDefinition:
    d = {"topic": f"{app_id}-{d['name']}-changelog", **d}
    defn = StoreDefinition.from_dict(d, REGISTRY)
    Catalog(broker.bootstrap_servers, app_id, REGISTRY).register(defn)
    return defn


def produce(broker, topic: str, partitions: int, records: list[tuple[bytes, bytes, bytes | None, int]]) -> None:
    """records: (plain key for partitioning, changelog key, value or None, timestamp)."""
    p = kafka.producer(broker.bootstrap_servers, **{"linger.ms": 20})
    for plain, key, value, ts in records:
        p.produce(topic, key=key, value=value, partition=partition_for(plain, partitions), timestamp=ts)
    assert p.flush(30) == 0


def read_partition(broker, topic: str, partition: int) -> list[tuple[int, bytes, bytes | None, int]]:
    """Every record of one partition: (offset, key, value, timestamp)."""
    c = kafka.reader(broker.bootstrap_servers)
    c.assign([TopicPartition(topic, partition, 0)])
    out = []
    try:
        while True:
            msgs = kafka.next_batch(c, 1000, 10)
            assert msgs, f"timed out reading {topic}[{partition}]"
            for m in msgs:
                if m.error():
                    assert m.error().code() == KafkaError._PARTITION_EOF, m.error()
                    return out
                out.append((m.offset(), m.key(), m.value(), m.timestamp()[1]))
    finally:
        c.close()


def describe_changelog(broker, topic: str, partitions: int) -> str:
    """For a failure's message: per partition, the broker's answers for where its log starts and
    ends (ListOffsets earliest, latest) and every record read from offset 0 (offset, key, value)."""
    from confluent_kafka.admin import OffsetSpec

    adm = kafka.admin(broker.bootstrap_servers)
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    answers = {name: adm.list_offsets({tp: spec for tp in tps})
               for name, spec in (("earliest", OffsetSpec.earliest()), ("latest", OffsetSpec.latest()))}
    lines = []
    for tp in tps:
        ends = " ".join(f"{name} {futures[tp].result(10).offset}" for name, futures in answers.items())
        records = [(o, _cut(k), _cut(v)) for o, k, v, _ in read_partition(broker, topic, tp.partition)]
        lines.append(f"{topic}[{tp.partition}] ({ends}): {records}")
    return "\n".join(lines)


def _cut(b: bytes | None, n: int = 40) -> bytes | None:
    return b if b is None or len(b) <= n else b[:n] + b"..."
