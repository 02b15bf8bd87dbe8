"""The catalog: store definitions kept in the compacted ``<application-id>-catalog`` topic.

Every node and every job reads the same topic, so they all agree on what a store is.
The record key is the store name, the value its definition as JSON (null = dropped).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from confluent_kafka import KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from federator import kafka
from federator.catalog.definition import DefinitionError, StoreDefinition, TypeLookup
from federator.errors import FederatorError

log = logging.getLogger(__name__)

COMPACTED = {"cleanup.policy": "compact"}


class CatalogConflict(FederatorError, ValueError):
    """A store of that name exists with another definition."""

    code = "INVALID_PARAMETER"


def catalog_topic(application_id: str) -> str:
    return f"{application_id}-catalog"


def changelog_topic(application_id: str, store: str) -> str:
    return f"{application_id}-{store}-changelog"


def apply_catalog_message(stores: dict[str, StoreDefinition], msg: Message, types: TypeLookup,
                          unusable: dict[str, str] | None = None) -> str | None:
    """Fold one catalog record into ``stores``, its definition built against ``types`` (the
    registry); returns the store name it changed.

    ``unusable`` collects why a store this process cannot use was skipped (say, its
    store type comes from a plugin that is not installed here)."""
    key = msg.key()
    if key is None:
        return None
    name = key.decode("utf-8", "replace")
    if unusable is not None:
        unusable.pop(name, None)
    if msg.value() is None:
        return name if stores.pop(name, None) is not None else None
    try:
        defn = StoreDefinition.from_json(msg.value(), types)
    except DefinitionError as e:
        # Another writer's bad record must not hide every other store.
        log.warning("catalog record for %r at offset %s is not a valid definition, skipped: %s", name, msg.offset(), e)
        if unusable is not None:
            unusable[name] = str(e)
        return name if stores.pop(name, None) is not None else None
    if stores.get(name) == defn:
        return None
    stores[name] = defn
    return name


@dataclass
class Catalog:
    bootstrap_servers: str
    application_id: str
    types: TypeLookup = field(repr=False)  # what the definitions read are built against: the registry
    timeout: float = 15.0
    # One admin client per Catalog, and the catalog topic checked once: a second load() (say,
    # register's re-read right after a writer's own check) costs only the read, not two new
    # broker connections (~70 ms).
    _admin: AdminClient | None = field(default=None, init=False, repr=False, compare=False)
    _topic_ready: bool = field(default=False, init=False, repr=False, compare=False)

    @property
    def topic(self) -> str:
        return catalog_topic(self.application_id)

    def admin(self) -> AdminClient:
        if self._admin is None:
            self._admin = kafka.admin(self.bootstrap_servers)
        return self._admin

    def ensure_topic(self) -> None:
        kafka.check_reachable(self.bootstrap_servers)
        kafka.ensure_topic(self.admin(), self.topic, 1, COMPACTED, self.timeout)
        self._topic_ready = True

    def load(self) -> dict[str, StoreDefinition]:
        """Every store definition, read from the start of the catalog topic to its end."""
        if not self._topic_ready:
            self.ensure_topic()
        consumer = kafka.reader(self.bootstrap_servers)
        stores: dict[str, StoreDefinition] = {}
        try:
            consumer.assign([TopicPartition(self.topic, 0, 0)])
            deadline = time.monotonic() + self.timeout
            while True:
                if time.monotonic() > deadline:
                    raise kafka.KafkaUnavailable(
                        f"reading catalog topic {self.topic!r} timed out after {self.timeout:.0f}s; "
                        f"is the broker at {self.bootstrap_servers} healthy?"
                    )
                msg = consumer.poll(0.5)
                if msg is None:
                    continue
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        return stores
                    raise kafka.KafkaUnavailable(f"reading catalog topic {self.topic!r}: {msg.error().str()}")
                apply_catalog_message(stores, msg, self.types)
        finally:
            consumer.close()

    def get(self, name: str) -> StoreDefinition | None:
        return self.load().get(name)

    def register(self, defn: StoreDefinition, producer: Producer | None = None) -> bool:
        """Create the changelog topic and record the definition. False if it was already there.

        The same definition again succeeds; a different one raises CatalogConflict naming the differences.
        ``producer``: the producer to record it with (a caller's warm one); by default a new one
        that is not idempotent: a new idempotent producer waits ~0.5 s for its producer id before
        its first delivery, and one record under the store's name, sent again on a retry, is the
        same entry of a compacted topic.
        """
        existing = self.load().get(defn.name)  # ``defn`` was validated as it was built
        if existing is not None:
            if existing == defn:
                kafka.ensure_topic(self.admin(), defn.topic, defn.partitions, COMPACTED, self.timeout)
                return False
            diffs = "; ".join(existing.differences(defn))
            raise CatalogConflict(
                f"store {defn.name!r} already exists with another definition (existing vs requested: {diffs}); "
                "use the existing definition or another store name"
            )
        kafka.ensure_topic(self.admin(), defn.topic, defn.partitions, COMPACTED, self.timeout)
        if producer is None:
            producer = kafka.producer(self.bootstrap_servers, **{"enable.idempotence": False, "linger.ms": 0})
        errors: list[str] = []
        producer.produce(
            self.topic, key=defn.name.encode(), value=defn.to_json(),
            on_delivery=lambda err, _msg: errors.append(err.str()) if err else None,
        )
        remaining = producer.flush(self.timeout)
        if remaining or errors:
            raise kafka.KafkaUnavailable(
                f"could not record store {defn.name!r} in {self.topic!r}: {errors[0] if errors else 'timed out'}"
            )
        return True
