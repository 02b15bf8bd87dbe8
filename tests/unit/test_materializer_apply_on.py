"""The materializer's hand-over of small fetches (``Materializer.apply_on``): a node on the loop
server has them applied on its event loop, between the answers there, and applies a large
fetch (a restore's, a catch-up's) or one the loop declines on the materializer's own thread.
Real shards on RocksDB; the consumer is a fake that hands over one batch a poll."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import pytest

from federator.node import materializer as materializing
from tests.unit.test_materializer_batches import Consumer, contents, materializer, record


class Runner:
    """Runs what it is handed on its own thread and waits for it, noting what the shard held
    before and after; or declines (``takes`` False) without running it."""

    def __init__(self, shard, takes: bool = True) -> None:
        self.shard, self.takes = shard, takes
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="runner")
        self.seen: list[tuple[str, dict, dict]] = []  # (thread, contents before, after)

    def __call__(self, work: Callable[[], None]) -> bool:
        if not self.takes:
            self.seen.append(("declined", {}, {}))
            return False

        def run() -> None:
            before = contents(self.shard)
            work()
            self.seen.append((threading.current_thread().name, before, contents(self.shard)))
        self.pool.submit(run).result()
        return True


def test_a_small_fetch_is_applied_by_the_runner_on_its_thread(tmp_path) -> None:
    m, shard = materializer(tmp_path)
    runner = Runner(shard)
    m.apply_on(runner)
    m._consume(Consumer([[record(0, "a"), record(1, "b")]]))
    ((thread, before, after),) = runner.seen
    assert thread.startswith("runner") and before == {} and after == {"a": "v", "b": "v"}
    assert shard.offset == 1


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
    assert runner.seen == [("declined", {}, {})] and contents(shard) == {"a": "v"}


def test_a_reader_waiting_for_the_shards_to_move_is_woken_by_a_handed_apply(tmp_path) -> None:
    m, shard = materializer(tmp_path)
    m.apply_on(Runner(shard))
    seen = m.wait_moved(-1, 0)
    moved: list[int] = []
    waiter = threading.Thread(target=lambda: moved.append(m.wait_moved(seen, 20)))
    waiter.start()
    m._consume(Consumer([[record(0, "a")]]))
    waiter.join(25)
    assert moved and moved[0] > seen


def test_an_error_in_a_handed_apply_reaches_the_materializer(tmp_path) -> None:
    """Raised in the materializer's thread, whose step logs it and tries again."""
    m, shard = materializer(tmp_path)

    def failing(work: Callable[[], None]) -> bool:
        raise RuntimeError("the loop's apply failed")

    m.apply_on(failing)
    with pytest.raises(RuntimeError, match="the loop's apply failed"):
        m._consume(Consumer([[record(0, "a")]]))
