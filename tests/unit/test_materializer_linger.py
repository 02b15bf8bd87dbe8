"""The materializer's linger (--apply-linger-ms): records fetched soon after others were applied
gather until it has passed and are then applied together; anyone waiting for the shards to move
(a read with a consistency token, another node's positions watch) has them applied at once.
Real shards on RocksDB; the consumer is a fake that hands over one batch a poll."""

from __future__ import annotations

import threading
import time

from tests.unit.test_materializer_batches import Consumer, contents, materializer, record


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


def test_a_reader_waiting_for_the_shards_to_move_has_the_records_applied_at_once(tmp_path) -> None:
    m, shard = materializer(tmp_path)
    m.apply_linger_s = 30.0
    consumer = Consumer([[record(0, "a")], [record(1, "b")]])
    stepped(m, consumer)
    seen = m.wait_moved(-1, 0)
    moved: list[int] = []
    waiter = threading.Thread(target=lambda: moved.append(m.wait_moved(seen, 20)))
    waiter.start()
    try:
        assert stepped(m, consumer) < 5
    finally:
        waiter.join(25)
    assert moved and moved[0] > seen and shard.offset == 1


def test_no_linger_after_a_full_batch(tmp_path) -> None:
    """A fetch that filled the batch leaves more to read (restoring, catching up): read on."""
    m, shard = materializer(tmp_path)
    m.apply_linger_s, m.batch_size = 30.0, 2
    consumer = Consumer([[record(0, "a"), record(1, "b")], [record(2, "c")]])
    stepped(m, consumer)
    assert stepped(m, consumer) < 5
    assert shard.offset == 2

