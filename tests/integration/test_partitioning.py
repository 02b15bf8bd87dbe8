"""Records produced with librdkafka's murmur2_random land where partition_for says."""

from __future__ import annotations

from confluent_kafka import Consumer, TopicPartition

from federator import kafka
from federator.partitioner import partition_for


def test_every_key_lands_on_the_partition_partition_for_predicts(broker, app_id) -> None:
    topic = f"{app_id}-partitioning"
    assert kafka.ensure_topic(kafka.admin(broker.bootstrap_servers), topic, 7)
    keys = [f"key-{i}".encode() for i in range(1200)] + [i.to_bytes(8, "big", signed=True) for i in range(-100, 100)]
    producer = kafka.producer(broker.bootstrap_servers)
    for k in keys:
        producer.produce(topic, key=k, value=b"x")
    assert producer.flush(30) == 0

    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": app_id, "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(7)])
    landed: dict[bytes, int] = {}
    eof: set[int] = set()
    while len(eof) < 7:
        msg = consumer.poll(10)
        assert msg is not None, "timed out reading the topic back"
        if msg.error():
            assert msg.error().code() == msg.error()._PARTITION_EOF, msg.error()
            eof.add(msg.partition())
            continue
        landed[msg.key()] = msg.partition()
    consumer.close()

    assert len(landed) == len(keys)
    wrong = {k: p for k, p in landed.items() if partition_for(k, 7) != p}
    assert not wrong, f"{len(wrong)} keys landed elsewhere than partition_for predicts"
    assert len(set(landed.values())) == 7
