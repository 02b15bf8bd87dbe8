"""Following a small compacted topic (the catalog, the membership records) from its start, live."""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from confluent_kafka import KafkaError, Message, TopicPartition

from federator import kafka

log = logging.getLogger(__name__)

ID_CHECK_SECONDS = 2.0


class TopicTail:
    """A thread that folds every record of partition 0 of ``topic`` into its owner's state.

    ``on_reset`` runs before the topic is read again from offset 0: when the topic was
    created anew (a broker restarted empty gets new topic ids), the old records are gone
    and what was built from them must go too.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        on_message: Callable[[Message], None],
        on_reset: Callable[[], None],
        name: str,
        create_config: dict[str, str] | None,
        fetch_wait_ms: int,
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.on_message = on_message
        self.on_reset = on_reset
        self.caught_up = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._topic_id: str | None = None
        self.create_config = create_config  # when set, a missing topic is created (system topics)
        self.fetch_wait_ms = fetch_wait_ms

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        admin = kafka.admin(self.bootstrap_servers)
        consumer = kafka.reader(self.bootstrap_servers, self.fetch_wait_ms)
        next_check = 0.0
        try:
            while not self._stop.is_set():
                try:
                    if time.monotonic() >= next_check:
                        next_check = time.monotonic() + ID_CHECK_SECONDS
                        self._check_topic(admin, consumer)
                    if self._topic_id is None:
                        self._stop.wait(0.2)
                        continue
                    for msg in kafka.next_batch(consumer, 500, 0.2):
                        err = msg.error()
                        if err is None:
                            self.on_message(msg)
                        elif err.code() == KafkaError._PARTITION_EOF:
                            self.caught_up.set()
                        else:
                            log.warning("reading %s: %s", self.topic, err.str())
                except Exception:  # noqa: BLE001 - keep following; a dead tail would freeze the node's view
                    log.exception("following topic %s failed; retrying", self.topic)
                    self._stop.wait(1.0)
        finally:
            consumer.close()

    def _check_topic(self, admin, consumer) -> None:
        """Notice the topic created anew (new id), and create a missing system topic."""
        try:
            current = kafka.topic_id(admin, self.topic, timeout=5)
            if current is None and self.create_config is not None:
                kafka.ensure_topic(admin, self.topic, 1, self.create_config, timeout=5)
                current = kafka.topic_id(admin, self.topic, timeout=5)
        except kafka.KafkaUnavailable as e:
            log.warning("cannot check topic %s: %s", self.topic, e)
            return
        if current == self._topic_id:
            return
        if self._topic_id is not None:
            log.warning("topic %s was created anew; reading it again from the start", self.topic)
            self.on_reset()
        self._topic_id = current
        self.caught_up.clear()
        if current is None:
            consumer.unassign()
        else:
            consumer.assign([TopicPartition(self.topic, 0, 0)])
