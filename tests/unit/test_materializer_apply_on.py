"""The materializer's hand-over of small fetches (``Materializer.apply_on``): a node on the loop
server has them applied on its event loop, between the answers there, and applies a large
fetch (a restore's, a catch-up's), one a reader waits for, or one the loop declines on the
materializer's own thread.
Real shards on RocksDB; the consumer is a fake that hands over one batch a poll."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import pytest

from federator.node import materializer as materializing
from federator.node.materializer import ACTIVE, HostedShard
from federator.store import Shard
from tests.unit.test_materializer_batches import Consumer, Message, contents, materializer, record
from tests.unit.test_position_watch import until


class Runner:
    """Runs the steps it is handed on its own thread and waits for them, noting what the shards
    held before the first and after each; or declines (``takes`` False) without running any."""

    def __init__(self, *shards, takes: bool = True) -> None:
        self.shards, self.takes = shards, takes
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="runner")
        self.seen: list[tuple[str, list[dict]]] = []  # (thread, the shards' contents before and after each step)

    def held(self) -> list[dict]:
        return [contents(s) for s in self.shards]

    def __call__(self, steps: Iterator[None]) -> bool:
        if not self.takes:
            self.seen.append(("declined", []))
            return False

        def run() -> None:
            states = [self.held()]
            for _ in steps:
                states.append(self.held())
            self.seen.append((threading.current_thread().name, states))
        self.pool.submit(run).result()
        return True


def test_a_small_fetch_is_applied_by_the_runner_on_its_thread_a_partition_a_step(tmp_path) -> None:
    m, shard = materializer(tmp_path)
    other = Shard(tmp_path / "s" / "1", shard.definition, 1)
    m._hosted[("s", 1)] = HostedShard(other, ACTIVE)
    runner = Runner(shard, other)
    m.apply_on(runner)
    m._consume(Consumer([[record(0, "a"), record(1, "b"), Message(1, 0, b"c", b"w")]]))
    ((thread, states),) = runner.seen
    assert thread.startswith("runner")
    assert states[0] == [{}, {}]
    assert states[1] == [{"a": "v", "b": "v"}, {}]  # one partition written, the loop free before the next
    assert states[-1] == [{"a": "v", "b": "v"}, {"c": "w"}]
    assert shard.offset == 1 and other.offset == 0


def test_a_fetch_of_more_than_the_handed_records_is_applied_on_the_materializer_thread(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(materializing, "HANDED_RECORDS", 1)
    m, shard = materializer(tmp_path)
    runner = Runner(shard)
    m.apply_on(runner)
    m._consume(Consumer([[record(0, "a"), record(1, "b")]]))
    assert runner.seen == [] and contents(shard) == {"a": "v", "b": "v"}


def test_a_fetch_the_runner_declines_is_applied_on_the_materializer_thread(tmp_path) -> None:
    """The loop server declines when its loop is not running (not yet, or no longer)."""
    m, shard = materializer(tmp_path)
    runner = Runner(shard, takes=False)
    m.apply_on(runner)
    m._consume(Consumer([[record(0, "a")]]))
    assert runner.seen == [("declined", [])] and contents(shard) == {"a": "v"}


def test_a_fetch_a_reader_waits_for_is_applied_on_the_materializer_thread_and_wakes_it(tmp_path) -> None:
    m, shard = materializer(tmp_path)
    runner = Runner(shard)
    m.apply_on(runner)
    seen = m.wait_moved(-1, 0)
    m._consume(Consumer([[record(0, "a")]]))  # handed: nobody waits yet
    moved: list[int] = []
    waiter = threading.Thread(target=lambda: moved.append(m.wait_moved(m.wait_moved(-1, 0), 20)))
    waiter.start()
    until(m._waited_for.is_set)
    m._consume(Consumer([[record(1, "b")]]))
    waiter.join(25)
    assert moved and moved[0] > seen + 1
    assert [thread.startswith("runner") for thread, _ in runner.seen] == [True]  # the waited-for fetch: not handed
    assert contents(shard) == {"a": "v", "b": "v"}


def test_an_error_in_a_handed_apply_reaches_the_materializer(tmp_path) -> None:
    """Raised in the materializer's thread, whose step logs it and tries again."""
    m, shard = materializer(tmp_path)

    def failing(steps: Iterator[None]) -> bool:
        raise RuntimeError("the loop's apply failed")

    m.apply_on(failing)
    with pytest.raises(RuntimeError, match="the loop's apply failed"):
        m._consume(Consumer([[record(0, "a")]]))
