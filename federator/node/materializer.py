"""Materializing: keep every hosted shard (active or standby) current from its changelog.

One thread and one assign-mode consumer serve every hosted partition, so a node's cost
does not grow with its shard count. Records are applied in batches, each batch in one
atomic write with the shard's new position: on that thread, or, for a small fetch, where
``apply_on`` hands it (a node on the loop server: its event loop, between two answers).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition

from federator import kafka
from federator.catalog.definition import StoreDefinition
from federator.node.changelog import to_records
from federator.settings import NodeSettings
from federator.store.layer import StoreLayer
from federator.store.shard import Shard

log = logging.getLogger(__name__)

ACTIVE = "active"
# The most records of one fetch applied where ``apply_on`` runs them (the HTTP server's event
# loop): enough for any steady stream, while a restore's or catch-up's full batches, which take
# tens of milliseconds, are applied on the materializer's thread and leave the loop answering.
HANDED_RECORDS = 500
STANDBY = "standby"
TOPIC_CHECK_SECONDS = 2.0


@dataclass
class HostedShard:
    shard: Any  # the top of the store's stack (a Shard, or layers over one: federator.store.layer)
    role: str
    restored: bool = False  # reached the log end since it was (re)assigned: current
    caught_up: bool = False  # reached the log end at least once since opened: fit for stale reads
    end_offset: int | None = None  # next offset the log will write, as last seen
    gone: bool = False  # its changelog topic no longer exists
    applied: int = 0  # records applied since this process opened it
    # The broker said offset 0 is out of its log's range (its start moved on): an empty copy
    # reads from where the broker says the log starts, not from offset 0.
    log_start_moved: bool = False

    @property
    def lag(self) -> int | None:
        if self.end_offset is None:
            return None
        nxt = (self.shard.offset + 1) if self.shard.offset is not None else 0
        return max(0, self.end_offset - nxt)


Key = tuple[str, int]  # (store, partition)


@dataclass
class Desired:
    definitions: dict[str, StoreDefinition] = field(default_factory=dict)
    roles: dict[Key, str] = field(default_factory=dict)


class Materializer:
    def __init__(self, bootstrap_servers: str, state_dir: Path, *, fetch_wait_ms: int,
                 on_change: Callable[[], None] = lambda: None,
                 open_store: Callable[[Path, StoreDefinition, int], StoreLayer] = Shard,
                 batch_size: int = 5000, apply_linger_ms: int = NodeSettings.apply_linger_ms) -> None:
        """``open_store(path, definition, partition)``: a store's stack of layers (the node's has
        its scan cache and metering; the default is the bare shard). ``batch_size``: the most
        records fetched at once (the records of one partition in it are applied in one write).
        ``fetch_wait_ms`` and ``apply_linger_ms``: the node's --fetch-wait-ms and --apply-linger-ms."""
        self.bootstrap_servers = bootstrap_servers
        self.batch_size = batch_size
        self.fetch_wait_ms = fetch_wait_ms
        self.apply_linger_s = apply_linger_ms / 1000
        self.open_store = open_store
        self.state_dir = state_dir
        self.on_change = on_change
        # Runs a fetch's apply steps on another thread and waits (True), or declines (False):
        # see apply_on. None applies every fetch on the materializer's thread.
        self._apply_on: Callable[[Iterator[None]], bool] | None = None
        self._hosted: dict[Key, HostedShard] = {}
        self._by_topic: dict[tuple[str, int], HostedShard] | None = None  # _hosted by (topic, partition), made when needed
        self._desired: Desired | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="materializer", daemon=True)
        self._topic_ids: dict[str, str | None] = {}
        # Counts every change to what the shards would answer (records applied, a role, a
        # copy current or not): a watcher waits on it (wait_moved) rather than polling.
        self._moved = threading.Condition()
        self._moves = 0
        # Records fetched soon after others were applied gather for the linger (_linger), unless
        # someone waits for the next records: set by a wait_moved that hurries, until the next move.
        self._waited_for = threading.Event()
        # The partitions (topic, partition) the hurrying readers wait for, until the next move;
        # None when one of them waits for any. Only theirs are applied before the linger is over.
        self._wanted: set[tuple[str, int]] | None = set()
        # Polled records of other partitions, held back while only the wanted ones were applied:
        # applied with the next fetch, or dropped when the consumer is assigned again (it then
        # reads them again, from past each shard's offset).
        self._held: list = []
        self._read_again = False  # set when a fetch's apply failed: the consumer is assigned anew
        self._applied_at = float("-inf")  # when the last fetch that did not fill a batch was applied
        # Counts the changes other than records applied: a copy opened, closed, reset, rebuilt,
        # current or not, its role. An offset names a shard's state only within one epoch.
        self.epoch = 0
        # Set when the broker connection broke: until the changelogs are checked again, no shard
        # counts as current (the broker may come back empty, with new topics).
        self._unverified = False

    # ---- called from other threads ---------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._waited_for.set()  # out of a linger at once
        self._thread.join(15)
        with self._lock:
            for hs in self._hosted.values():
                hs.shard.close()
            self._hosted.clear()
            self._by_topic = None

    def set_desired(self, definitions: dict[str, StoreDefinition], roles: dict[Key, str]) -> None:
        with self._lock:
            self._desired = Desired(dict(definitions), dict(roles))

    def apply_on(self, run: Callable[[Iterator[None]], bool] | None) -> None:
        """Have fetches of at most HANDED_RECORDS records applied by ``run``, which runs the
        steps it is given (a partition's write each) on its own thread and waits for the last,
        or returns False without running any (then this thread applies them): the HTTP
        server's event loop (``LoopServer.run_on_loop``), so the applies and the answers there
        take the GIL in turn, a partition at a time. A fetch that someone waits for (a
        consistency token's read: ``wait_moved``) is applied on this thread at once,
        so the waiter does not wait for the loop's turn as well. None: all on this thread."""
        self._apply_on = run

    def hosted(self, store: str, partition: int) -> HostedShard | None:
        return self._hosted.get((store, partition))

    def snapshot(self) -> dict[Key, HostedShard]:
        with self._lock:
            return dict(self._hosted)

    def wait_moved(self, seen: int, timeout: float, hurry: bool = True,
                   want: set[tuple[str, int]] | None = None) -> int:
        """The change count once it is past ``seen`` (at once if it already is), or after
        ``timeout`` seconds; -1 to read it without waiting. ``hurry``: the waiter wants the
        next records now (a read with a consistency token), so what is fetched meanwhile is
        applied at once (only the partitions ``want`` names, (topic, partition), when it
        names them); False for one that only follows the changes (another node's positions
        watch), which the linger then lets gather as for no one."""
        with self._moved:
            if seen >= 0 and self._moves == seen:
                if hurry:
                    self._wanted = None if want is None or self._wanted is None else self._wanted | want
                    self._waited_for.set()
                self._moved.wait(timeout)
            return self._moves

    def _changed(self) -> None:
        self.epoch += 1
        self._moves_on()
        self.on_change()

    def _moves_on(self) -> None:
        with self._moved:
            self._moves += 1
            self._waited_for.clear()  # each waiter wakes to this move, and waits again if it wants more
            self._wanted = set()
            self._moved.notify_all()

    # ---- the materializer thread -----------------------------------------------------------
    def _run(self) -> None:
        admin = kafka.admin(self.bootstrap_servers)
        consumer = kafka.reader(
            self.bootstrap_servers, self.fetch_wait_ms,
            **{"auto.offset.reset": "error", "fetch.max.bytes": 52428800, "error_cb": self._on_client_error},
        )
        next_check = 0.0
        try:
            while not self._stop.is_set():
                try:
                    next_check = self._step(consumer, admin, next_check)
                except Exception:  # noqa: BLE001 - keep materializing; the next step tries again
                    log.exception("materializer step failed; retrying")
                    self._stop.wait(1.0)
        finally:
            consumer.close()

    def _step(self, consumer, admin, next_check: float) -> float:
        reassign = self._read_again
        with self._lock:
            desired, self._desired = self._desired, None
        if desired is not None:
            try:
                reassign = self._reconcile(desired, admin)
            except Exception:
                with self._lock:  # try this wish again next step, unless a newer one came
                    self._desired = self._desired or desired
                raise
        if time.monotonic() >= next_check:
            next_check = time.monotonic() + TOPIC_CHECK_SECONDS
            unverified = self._unverified
            try:
                reassign = self._check_topics(admin) or reassign
                if unverified:
                    self._unverified = False
                    reassign = True  # fetch again so the log end is seen anew
            except kafka.KafkaUnavailable as e:
                log.warning("cannot check changelogs: %s", e)
        if reassign:
            self._assign(consumer)
        if not self._hosted:
            self._stop.wait(0.1)
            return next_check
        self._linger()
        try:
            self._consume(consumer)
        except Exception:
            # the records polled and not applied are past the consumer's position: read them
            # again, from past each shard's offset, or they would be skipped
            self._read_again = True
            raise
        return next_check

    def _linger(self) -> None:
        """Let records fetched soon after the last were applied gather until the linger since
        then has passed: a stream of small fetches then costs a write a partition per linger,
        not per fetch. Cut short the moment anyone waits for the next records (a read with a
        consistency token this node has not reached, asked here or by another node); then
        only the partitions such readers named are applied, and the others' records held back
        (_consume)."""
        left = self._linger_left()
        if left > 0:
            self._waited_for.wait(left)

    def _linger_left(self) -> float:
        """Seconds until the linger since the last apply is over (0 or less: it is)."""
        return self._applied_at + self.apply_linger_s - time.monotonic()

    def _reconcile(self, desired: Desired, admin) -> bool:
        changed = False
        for key in list(self._hosted):
            hs = self._hosted[key]
            defn = desired.definitions.get(key[0])
            if key not in desired.roles or defn is None or defn != hs.shard.definition:
                # Closed, not deleted: if the partition comes back here, it restores from this checkpoint.
                with self._lock:
                    del self._hosted[key]
                    self._by_topic = None
                hs.shard.close()
                changed = True
        for key, role in desired.roles.items():
            hs = self._hosted.get(key)
            if hs is not None:
                if hs.role != role:
                    hs.role = role
                    if role == ACTIVE:
                        hs.restored = hs.lag == 0 and hs.end_offset is not None
                    self._changed()
                continue
            store, partition = key
            defn = desired.definitions[store]
            shard = self.open_store(self.state_dir / store / str(partition), defn, partition)
            topic_id = self._topic_ids.get(defn.topic) or kafka.topic_id(admin, defn.topic, timeout=5)
            self._topic_ids[defn.topic] = topic_id
            hs = HostedShard(shard, role)
            if topic_id is None:
                shard.reset()
                hs.gone = True
            elif shard.set_source(topic_id):
                log.warning("%s[%d]: changelog was created anew; rebuilding the shard", defn.topic, partition)
            with self._lock:
                self._hosted[key] = hs
                self._by_topic = None
            changed = True
        if changed:
            self._changed()
        return changed

    def _check_topics(self, admin) -> bool:
        """Find changelogs deleted or created anew (a broker restarted empty gives new topic ids)."""
        topics = {hs.shard.topic for hs in self._hosted.values()}
        changed = False
        for topic in topics:
            current = kafka.topic_id(admin, topic, timeout=5)
            self._topic_ids[topic] = current
            for hs in self._hosted.values():
                if hs.shard.topic != topic:
                    continue
                if current is None:
                    if not hs.gone:
                        log.warning("%s is gone: dropping the data of partition %d", topic, hs.shard.partition)
                        hs.shard.reset()
                        hs.gone, hs.restored, hs.caught_up, hs.end_offset = True, False, False, None
                        changed = True
                elif hs.shard.source != current or hs.gone:
                    if hs.shard.set_source(current):
                        log.warning("%s was created anew: rebuilding partition %d", topic, hs.shard.partition)
                    hs.gone, hs.restored, hs.caught_up, hs.end_offset = False, False, False, None
                    changed = True
        if changed:
            self._changed()
        return changed

    def _assign(self, consumer) -> None:
        self._held = []  # read again from past each shard's offset
        tps = []
        for hs in self._hosted.values():
            if not hs.gone:
                tps.append(TopicPartition(hs.shard.topic, hs.shard.partition, _start(hs)))
        consumer.assign(tps)
        self._read_again = False

    def _consume(self, consumer) -> None:
        wanted = self._wanted_now()
        wait = 0.1
        if self._held:  # not past the linger: held records are applied when it is over
            wait = 0.0 if wanted is None else min(wait, max(0.0, self._linger_left()))
        messages = self._held + kafka.next_batch(consumer, self.batch_size, wait)
        self._held = []
        if wanted is not None:  # the rest gathers on for the linger
            messages, self._held = _split(messages, wanted)
        if not messages:
            return
        out_of_range: set[tuple[str, int]] = set()
        steps = self._applying(messages, consumer, out_of_range, partial=wanted is not None)
        run = self._apply_on
        if run is None or self._waited_for.is_set() or len(messages) > HANDED_RECORDS or not run(steps):
            for _ in steps:
                pass
        if out_of_range:
            # after the other partitions' records are applied: the assignment starts each of
            # them past what it holds, not where this batch was fetched from
            self._rebuild(out_of_range, consumer)

    def _wanted_now(self) -> set[tuple[str, int]] | None:
        """The partitions to apply now while the others gather on: those the hurrying readers
        named, while the linger lasts; None to apply everything fetched."""
        with self._moved:
            wanted = self._wanted if self._waited_for.is_set() else None
        # (never changed in place: a waiter's wish makes a new set, and each move another)
        return None if not wanted or self._linger_left() <= 0 else wanted

    def _applying(self, messages: list, consumer, out_of_range: set[tuple[str, int]],
                  partial: bool = False) -> Iterator[None]:
        """A fetch's records applied to their shards, a step (a yield) after each partition's
        write, and the waiters told at the end; ``out_of_range`` gets the partitions the broker
        said are out of range, which the caller rebuilds (on its thread: that reassigns the
        consumer). ``partial``: only the partitions readers wait for, the others held back,
        which leaves the linger running."""
        by_tp: dict[tuple[str, int], list] = defaultdict(list)
        eof: list[tuple[str, int, int]] = []
        for m in messages:
            err = m.error()
            if err is None:
                by_tp[(m.topic(), m.partition())].append(m)
            elif err.code() == KafkaError._PARTITION_EOF:
                eof.append((m.topic(), m.partition(), m.offset()))
            elif err.code() == KafkaError._AUTO_OFFSET_RESET:
                out_of_range.add((m.topic(), m.partition()))
            elif err.code() in (KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT):
                self._on_client_error(err)
            else:
                log.warning("reading %s[%s]: %s", m.topic(), m.partition(), err.str())
        index = self._by_topic
        if index is None:
            index = self._by_topic = {(hs.shard.topic, hs.shard.partition): hs for hs in self._hosted.values()}
        changed = moved = False
        for tp, msgs in by_tp.items():
            hs = index.get(tp)
            # A partition the broker just said is out of range: its records here came from the
            # log before (truncated, created anew) and are not applied to the rebuilt shard.
            if hs is None or hs.gone or tp in out_of_range:
                continue
            msgs = _past(msgs, hs.shard.offset)
            if msgs:
                hs.shard.apply(to_records(msgs))
                hs.applied += len(msgs)
                moved = True
                yield
            _, high = consumer.get_watermark_offsets(TopicPartition(*tp), cached=True)
            if high is not None and high >= 0:
                hs.end_offset = high
                # at the log's end as the fetch saw it: as good as the end-of-partition event,
                # which a log written to all the time may not give for seconds
                if not hs.restored and hs.lag == 0:
                    hs.restored = hs.caught_up = True
                    changed = True
        for topic, partition, offset in eof:
            hs = index.get((topic, partition))
            if hs is None or (topic, partition) in out_of_range:
                continue
            # read to the end: offsets below it that held no data (transaction markers) are
            # applied too, so a token at the log's end is reached
            applied = hs.shard.offset
            if not hs.gone and offset - 1 > (-1 if applied is None else applied):  # (usually: its last record applied)
                before, after = hs.shard.apply([], through=offset - 1)
                moved = moved or after != before
            hs.end_offset = offset
            if not hs.restored:
                hs.restored = hs.caught_up = True
                changed = True
        if moved and not partial:  # a full batch leaves more to read at once (restoring, catching up): no linger after it
            self._applied_at = time.monotonic() if len(messages) < self.batch_size else float("-inf")
        if out_of_range:
            return  # the caller's _rebuild tells the waiters
        if changed:
            self._changed()
        elif moved:
            self._moves_on()

    def _on_client_error(self, err: KafkaError) -> None:
        """Connection trouble (runs inside consume): the broker may come back empty, so no shard
        counts as current until its changelog has been checked again."""
        if err.code() not in (KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT) or self._unverified:
            return
        log.warning("lost the broker (%s): shards are not current until their changelogs are checked", err.str())
        self._unverified = True
        for hs in self._hosted.values():
            hs.restored = False
        self._changed()

    def _rebuild(self, partitions: set[tuple[str, int]], consumer) -> None:
        """The recorded offsets of ``partitions`` are out of their logs' range (truncated, reset): start over."""
        for hs in self._hosted.values():
            if (hs.shard.topic, hs.shard.partition) in partitions:
                log.warning("%s[%d]: offset out of range; rebuilding the shard", hs.shard.topic, hs.shard.partition)
                hs.shard.reset()
                hs.restored, hs.caught_up, hs.end_offset = False, False, None
                hs.log_start_moved = True
        self._changed()
        self._assign(consumer)


def _start(hs: HostedShard) -> int:
    """Where a copy reads its changelog from: past what it holds; an empty one from offset 0.
    Not from the broker's answer for the log's start (OFFSET_BEGINNING) unless offset 0 is out
    of range: tansu answers it with the offset of the batch it stored first, and two producers'
    batches can be stored in the other order than their offsets, so that answer can lie past
    the log's first records."""
    if hs.shard.offset is not None:
        return hs.shard.offset + 1
    return OFFSET_BEGINNING if hs.log_start_moved else 0


def _split(messages: list, wanted: set[tuple[str, int]]) -> tuple[list, list]:
    """(the messages to apply now, those held back): the records and end-of-partition events of
    partitions not ``wanted`` are held back, in order; an error is never held."""
    now: list = []
    held: list = []
    for m in messages:
        err = m.error()
        hold = (err is None or err.code() == KafkaError._PARTITION_EOF) and (m.topic(), m.partition()) not in wanted
        (held if hold else now).append(m)
    return now, held


def _past(messages: list, offset: int | None) -> list:
    """The messages after ``offset``, the last one the shard applied. A message at or before it
    is one the consumer was not asked for (fetched before the shard last moved): applying it
    would take the shard back to an older state under a position it has already passed."""
    if offset is None or not messages or messages[0].offset() > offset:
        return messages
    return [m for m in messages if m.offset() > offset]
