"""confluent-kafka clients configured the way every Federator component needs them."""

from __future__ import annotations

import concurrent.futures
import logging
import os
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic


class KafkaUnavailable(RuntimeError):
    """The broker could not be reached or refused a request."""


# librdkafka logs every failed connect attempt; callers report failures themselves, so the
# client's own log is kept quiet unless asked for (FEDERATOR_KAFKA_DEBUG=1).
_client_log = logging.getLogger("federator.kafka.client")
if not os.environ.get("FEDERATOR_KAFKA_DEBUG"):
    _client_log.setLevel(logging.CRITICAL)
    _client_log.propagate = False


def base_config(bootstrap_servers: str) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap_servers, "logger": _client_log}


def check_reachable(bootstrap_servers: str, timeout: float = 5.0) -> None:
    """Raise KafkaUnavailable with what to do when no broker answers at ``bootstrap_servers``."""
    try:
        admin(bootstrap_servers).list_topics(timeout=timeout)
    except KafkaException:
        raise KafkaUnavailable(
            f"no Kafka broker answers at {bootstrap_servers}: start one with `federator broker` "
            "or pass --bootstrap-servers HOST:PORT"
        ) from None


def producer(bootstrap_servers: str, **overrides: Any) -> Producer:
    """An idempotent producer whose partitioner matches Java's (murmur2), as store topics need."""
    conf: dict[str, Any] = {
        **base_config(bootstrap_servers),
        "partitioner": "murmur2_random",
        "enable.idempotence": True,
        "linger.ms": 5,
        "compression.type": "none",
        # a typo'd topic must fail, not appear with the broker's default partition count
        "allow.auto.create.topics": False,
    }
    conf.update(overrides)
    return Producer(conf)


def reader(bootstrap_servers: str, **overrides: Any) -> Consumer:
    """A consumer for reading assigned partitions by offset; it never joins a group or commits."""
    conf: dict[str, Any] = {
        **base_config(bootstrap_servers),
        "group.id": "federator-reader",  # required by librdkafka even when only assign() is used
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "enable.partition.eof": True,
        "fetch.wait.max.ms": 50,  # tailing a changelog: new records should show up fast
    }
    conf.update(overrides)
    return Consumer(conf)


def next_batch(consumer: Consumer, max_messages: int, timeout: float) -> list:
    """Wait up to ``timeout`` for a first message, then take what is already queued, up to
    ``max_messages``. (``Consumer.consume`` alone waits out its timeout unless the batch fills.)"""
    first = consumer.poll(timeout)
    if first is None:
        return []
    if max_messages <= 1:
        return [first]
    return [first, *consumer.consume(max_messages - 1, 0)]


def admin(bootstrap_servers: str) -> AdminClient:
    return AdminClient(base_config(bootstrap_servers))


def topic_partitions(adm: AdminClient, topic: str, timeout: float = 10.0) -> int | None:
    """Partition count of ``topic``, None if it does not exist."""
    try:
        # Not list_topics(topic=...): that asks for one topic, which some brokers (tansu) create.
        md = adm.list_topics(timeout=timeout)
    except KafkaException as e:
        raise KafkaUnavailable(f"cannot read topic metadata: {e}; is the broker running?") from None
    t = md.topics.get(topic)
    if t is None or t.error is not None and t.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
        return None
    return len(t.partitions)


def topic_id(adm: AdminClient, topic: str, timeout: float = 10.0) -> str | None:
    """The broker's id of ``topic`` (it changes when a topic is deleted and created again)."""
    from confluent_kafka import TopicCollection

    try:
        desc = adm.describe_topics(TopicCollection([topic]), request_timeout=timeout)[topic].result(timeout)
    except concurrent.futures.TimeoutError:
        raise KafkaUnavailable(f"describing topic {topic!r} timed out after {timeout:.0f}s; is the broker up?") from None
    except KafkaException as e:
        if e.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            return None
        raise KafkaUnavailable(f"cannot describe topic {topic!r}: {e.args[0].str()}") from None
    return str(desc.topic_id) if desc.topic_id is not None else None


def ensure_topic(
    adm: AdminClient, topic: str, partitions: int, config: dict[str, str] | None = None, timeout: float = 10.0
) -> bool:
    """Create ``topic`` unless it exists; an existing topic must have ``partitions``. True if created."""
    futures = adm.create_topics(
        # replicated as the broker's default.replication.factor says: a production cluster's choice
        [NewTopic(topic, num_partitions=partitions, replication_factor=-1, config=config or {})],
        request_timeout=timeout,
    )
    try:
        futures[topic].result(timeout=timeout)
        return True
    except concurrent.futures.TimeoutError:
        raise KafkaUnavailable(f"creating topic {topic!r} timed out after {timeout:.0f}s; is the broker healthy?") from None
    except KafkaException as e:
        err = e.args[0]
        if err.code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise KafkaUnavailable(f"cannot create topic {topic!r}: {err.str()}") from None
    existing = topic_partitions(adm, topic, timeout)
    if existing is not None and existing != partitions:
        raise ValueError(
            f"topic {topic!r} exists with {existing} partitions, not {partitions}; "
            "use the existing count or another topic"
        )
    return False
