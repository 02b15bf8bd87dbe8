"""The materializer's linger (--apply-linger-ms): records fetched soon after others were applied
gather until it has passed and are then applied together; a reader that wants the next records
(a read with a consistency token this node has not reached, asked here or by another node) has
them applied at once, and one that only follows the changes (another node's positions watch)
does not. Real shards on RocksDB, the consumer a fake that hands over one batch a poll; and a
node's owner code (a MemoryCluster's) over a materializer with records not applied yet."""

from __future__ import annotations

import threading
import time
from typing import Callable

import pytest
from confluent_kafka import KafkaError

from federator.catalog import StoreDefinition
from federator.node.node import TOKEN_WAIT_S
from federator.owner.duck import Duck, DuckConfig
from federator.query.position import Position, PositionBound
from federator.query.queries import KeyQuery
from federator.query.request import StateQueryRequest
from federator.query.result import FailureReason
from tests.registry import REGISTRY
from tests.unit import memory_cluster
from tests.unit.memory_cluster import MemoryCluster
from tests.unit.test_materializer_batches import (TOPIC, Consumer, Message, contents, materializer,
                                                  materializer_of, record)


def stepped(m, consumer: Consumer) -> float:
    """Seconds the materializer's next step took: its linger, then the next fetch applied."""
    started = time.monotonic()
    m._step(consumer, None, float("inf"))
    return time.monotonic() - started


def test_records_fetched_soon_after_others_were_applied_wait_out_the_linger(tmp_path) -> None:
    m, shard = materializer(tmp_path)
    m.apply_linger_s = 0.5
    consumer = Consumer([[record(0, "a")], [record(1, "b")]])
    assert stepped(m, consumer) < 0.4  # nothing applied before it: at once
    assert shard.offset == 0
    assert stepped(m, consumer) >= 0.45
    assert contents(shard) == {"a": "v", "b": "v"}


@pytest.mark.parametrize("hurry", [True, False])
def test_a_reader_that_wants_the_next_records_has_them_at_once_and_a_watch_that_follows_waits_the_linger(
        tmp_path, hurry: bool) -> None:
    """A read with a consistency token waits in a hurry; another node's positions watch only
    follows the changes, and the records gather as for no one."""
    m, shard = materializer(tmp_path)
    m.apply_linger_s = 2.0
    consumer = Consumer([[record(0, "a")], [record(1, "b")]])
    stepped(m, consumer)
    seen = m.wait_moved(-1, 0)
    moved: list[int] = []
    waiter = threading.Thread(target=lambda: moved.append(m.wait_moved(seen, 20, hurry=hurry)))
    waiter.start()
    try:
        time.sleep(0.05)  # it waits
        took = stepped(m, consumer)
    finally:
        waiter.join(25)
    assert took < 1.5 if hurry else took >= 1.9
    assert moved and moved[0] > seen and shard.offset == 1


def hurried_step(m, consumer: Consumer, want: set[tuple[str, int]]) -> float:
    """The next step while a reader waits in a hurry for ``want``'s records; seconds it took."""
    seen = m.wait_moved(-1, 0)
    waiter = threading.Thread(target=lambda: m.wait_moved(seen, 20, want=want))
    waiter.start()
    try:
        time.sleep(0.05)  # it waits
        return stepped(m, consumer)
    finally:
        waiter.join(25)


def test_a_reader_waiting_for_some_partitions_has_theirs_applied_at_once_and_the_rest_after_the_linger(
        tmp_path) -> None:
    """A read with a consistency token names the partitions it waits for: their fetched
    records are applied at once; the other partitions' (their end-of-partition event too)
    gather on until the linger is over, and none is lost."""
    m, (s0, s1) = materializer_of(tmp_path, 2)
    m.apply_linger_s = 2.0
    consumer = Consumer([[Message(0, 0, b"a", b"v"), Message(1, 0, b"b", b"v")],
                         [Message(0, 1, b"c", b"v"), Message(1, 1, b"d", b"v"),
                          Message(0, 2, code=KafkaError._PARTITION_EOF)], []])
    stepped(m, consumer)
    assert hurried_step(m, consumer, {(TOPIC, 1)}) < 1.5
    assert (s0.offset, s1.offset) == (0, 1) and contents(s1) == {"b": "v", "d": "v"}
    assert stepped(m, consumer) >= 1.5  # the rest, once the linger is over
    assert (s0.offset, contents(s0)) == (1, {"a": "v", "c": "v"})


def test_records_held_back_are_not_applied_to_a_shard_rebuilt_meanwhile(tmp_path) -> None:
    """Partition 0's next record is held back while a reader waits for partition 1; then the
    broker says partition 0's log is out of range (truncated, created anew): the rebuilt shard
    gets what the log holds now, not the held record of the old log."""
    m, (s0, s1) = materializer_of(tmp_path, 2)
    m.apply_linger_s = 2.0
    consumer = Consumer([[Message(0, 0, b"a", b"v"), Message(1, 0, b"b", b"v")],
                         [Message(0, 1, b"old", b"v"), Message(1, 1, b"d", b"v")],
                         [Message(0, 2, code=KafkaError._AUTO_OFFSET_RESET), Message(1, 2, b"e", b"v")]])
    stepped(m, consumer)
    hurried_step(m, consumer, {(TOPIC, 1)})
    hurried_step(m, consumer, {(TOPIC, 1)})
    assert (s0.offset, s1.offset) == (None, 2)
    consumer.batches = [[Message(0, 0, b"new", b"N")]]
    stepped(m, consumer)
    assert (s0.offset, contents(s0)) == (0, {"new": "N"})


def test_no_linger_after_a_full_batch(tmp_path) -> None:
    """A fetch that filled the batch leaves more to read (restoring, catching up): read on."""
    m, shard = materializer(tmp_path)
    m.apply_linger_s, m.batch_size = 30.0, 2
    consumer = Consumer([[record(0, "a"), record(1, "b")], [record(2, "c")]])
    stepped(m, consumer)
    assert stepped(m, consumer) < 5
    assert shard.offset == 2


class Lingering(memory_cluster.Materializer):
    """A node's materializer with fetched records it has not applied yet: they are applied
    when a reader waits for them in a hurry (``wait_moved``'s default), not before."""

    def __init__(self, shards: dict, fetched: Callable[[], None] | None, linger_s: float) -> None:
        super().__init__(shards)
        self.fetched, self.apply_linger_s, self.moves = fetched, linger_s, 0

    def wait_moved(self, seen: int, timeout: float, hurry: bool = True, want: set | None = None) -> int:
        if seen >= 0 and hurry and self.fetched is not None:
            self.fetched, apply = None, self.fetched
            apply()
            self.moves += 1
        elif seen >= 0:
            time.sleep(min(timeout, 0.01))
        return self.moves


@pytest.mark.parametrize("fetched", [True, False])
def test_a_read_for_offsets_not_applied_yet_has_them_applied_and_is_answered_or_is_refused_before_the_linger(
        tmp_path, fetched: bool) -> None:
    """Another node's read with a consistency token: answered once the records it asks for are
    applied (at once, not after the linger), refused NOT_UP_TO_BOUND when they do not come
    within the owner's short wait, however long the linger (the caller asks again when this
    node's positions watch says so, and must have time left to)."""
    defn = StoreDefinition.from_dict({"name": "scores", "type": "kv", "topic": "scores-changelog", "partitions": 2,
                                      "key": {"name": "key", "format": "long"},
                                      "value": {"name": "score", "format": "double"}}, REGISTRY)
    cluster = MemoryCluster([defn], Duck(DuckConfig(memory_limit="64MB", spill_dir=tmp_path)))
    p = cluster.write("scores", 7, 1.5)
    node, offset = cluster.nodes["me"], cluster.shards[("scores", p)].offset
    assert offset is not None
    node.materializer = Lingering(node.materializer.shards, (lambda: cluster.write("scores", 7, 2.5)) if fetched
                                  else None, linger_s=0.3)
    bound = PositionBound.at(Position.of(defn.topic, p, offset + 1))
    started = time.monotonic()
    (result,) = node.execute(StateQueryRequest("scores", KeyQuery(7), (p,), bound, require_active=True))
    took = time.monotonic() - started
    if fetched:
        assert result.failure is None and result.batch.to_pylist()[0]["score"] == 2.5
        assert took < 0.25
    else:
        assert result.failure is FailureReason.NOT_UP_TO_BOUND
        assert TOKEN_WAIT_S <= took < 0.25
