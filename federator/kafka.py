"""confluent-kafka clients configured the way every Federator component needs them."""

from __future__ import annotations

import concurrent.futures
import logging
import os
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from federator import kafka_properties
from federator.kafka_properties import ClientProperties
from federator.errors import FederatorError


class KafkaUnavailable(FederatorError, RuntimeError):
    """The broker could not be reached or refused a request."""

    code = "UNAVAILABLE"


# librdkafka logs every failed connect attempt; callers report failures themselves, so the
# client's own log is kept quiet unless asked for (FEDERATOR_KAFKA_DEBUG=1).
_client_log = logging.getLogger("federator.kafka.client")
if not os.environ.get("FEDERATOR_KAFKA_DEBUG"):
    _client_log.setLevel(logging.CRITICAL)
    _client_log.propagate = False


# The client properties given for a cluster (`--kafka-config`, a Spark write's kafka_config), by
# its bootstrap servers; a cluster given none gets $FEDERATOR_KAFKA_CONFIG's.
_GIVEN: dict[str, ClientProperties] = {}
_FROM_ENVIRONMENT: list[ClientProperties] = []  # read once, when first needed


def use_client_properties(bootstrap_servers: str, properties: ClientProperties) -> None:
    """Every client of ``bootstrap_servers`` that this process makes from now on gets ``properties``."""
    _GIVEN[bootstrap_servers] = properties


def client_properties(bootstrap_servers: str) -> ClientProperties:
    if bootstrap_servers in _GIVEN:
        return _GIVEN[bootstrap_servers]
    if not _FROM_ENVIRONMENT:
        _FROM_ENVIRONMENT.append(kafka_properties.from_environment())
    return _FROM_ENVIRONMENT[0]


def base_config(bootstrap_servers: str) -> dict[str, Any]:
    """What every client of the cluster starts from: its client properties, its brokers, our log."""
    return {**client_properties(bootstrap_servers).values, "bootstrap.servers": bootstrap_servers,
            "logger": _client_log}


def check_reachable(bootstrap_servers: str, timeout: float = 5.0) -> None:
    """Raise KafkaUnavailable saying what to do when the cluster at ``bootstrap_servers`` does
    not answer: no broker there, credentials it refused, or a certificate not trusted."""
    errors: list[KafkaError] = []
    adm = AdminClient({**base_config(bootstrap_servers), "error_cb": errors.append})
    try:
        adm.list_topics(timeout=timeout)
        return
    except KafkaException as e:
        errors.append(e.args[0])
    adm.poll(0)  # serves the error callbacks of the failed connections
    raise KafkaUnavailable(_why_unreachable(bootstrap_servers, errors)) from None


def _why_unreachable(bootstrap_servers: str, errors: list[KafkaError]) -> str:
    props = client_properties(bootstrap_servers)
    by_code = {e.code(): props.redact(e.str()) for e in errors}
    if KafkaError._AUTHENTICATION in by_code:
        return (f"the Kafka cluster at {bootstrap_servers} refused the SASL credentials of sasl.username "
                f"{props.get('sasl.username')!r} (sasl.mechanism {props.get('sasl.mechanism', 'GSSAPI')}): "
                f"{by_code[KafkaError._AUTHENTICATION]}; check sasl.username and sasl.password in {props.source}")
    if KafkaError._SSL in by_code:
        ca = props.get("ssl.ca.location") or "not set, so the system's CA certificates"
        what = ("the Kafka brokers' TLS certificate is not signed by the CA certificate in ssl.ca.location "
                f"({ca}) of {props.source}: name the CA that signed it there"
                if "certificate verify failed" in by_code[KafkaError._SSL] else
                f"check the ssl.* properties in {props.source}")
        return f"the TLS handshake with the Kafka cluster at {bootstrap_servers} failed; {what} ({by_code[KafkaError._SSL]})"
    return (f"no Kafka broker answers at {bootstrap_servers}: start one with `federator broker` "
            "or pass --bootstrap-servers HOST:PORT (and --kafka-config FILE with the client properties a "
            "secured cluster needs)")


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


# A read to the end once: the end shows as an empty fetch, which the broker need not hold.
READ_TO_END_WAIT_MS = 5
MAX_FETCH_WAIT_MS = 300_000  # the most fetch.wait.max.ms librdkafka takes


def reader(bootstrap_servers: str, fetch_wait_ms: int = READ_TO_END_WAIT_MS, **overrides: Any) -> Consumer:
    """A consumer for reading assigned partitions by offset; it never joins a group or commits.
    ``fetch_wait_ms``: how long the broker may hold a fetch with nothing new (a tail that runs
    for good passes the node's --fetch-wait-ms)."""
    conf: dict[str, Any] = {
        **base_config(bootstrap_servers),
        "group.id": "federator-reader",  # required by librdkafka even when only assign() is used
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "enable.partition.eof": True,
        "fetch.wait.max.ms": fetch_wait_ms,
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
    # Admin requests go to the broker the client takes for the controller (on KRaft clusters,
    # any broker). Metadata refreshed every 2 s finds another one soon after that broker stops;
    # with the 5-minute default, requests failed with "Timed out waiting for controller" for
    # minutes, and the node's changelog checks with them.
    return AdminClient({**base_config(bootstrap_servers), "topic.metadata.refresh.interval.ms": 2000})


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
