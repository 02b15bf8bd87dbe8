"""streaming.in_parallel: the stores' updates of a micro-batch, side by side."""

from __future__ import annotations

import threading
import time

import pytest

from federator_spark.jobs.streaming import in_parallel


def test_groups_run_at_once_and_calls_within_a_group_in_order():
    both_started = threading.Barrier(2, timeout=5)  # only passes when the two groups overlap
    seen: list[str] = []

    def call(name: str, wait: bool = False):
        def run() -> str:
            if wait:
                both_started.wait()
            seen.append(name)
            return name.upper()
        return run

    out = in_parallel([[("a", call("a", wait=True)), ("b", call("b"))], [("c", call("c", wait=True))]])
    assert out == {"a": "A", "b": "B", "c": "C"}
    assert list(out) == ["a", "b", "c"]  # the groups' order, whatever finished first
    assert seen.index("a") < seen.index("b")


def test_a_failure_is_raised_after_every_group_has_ended():
    ended = threading.Event()

    def fails() -> None:
        raise ValueError("store a could not be written")

    def slow() -> str:
        time.sleep(0.2)
        ended.set()
        return "done"

    with pytest.raises(ValueError, match="store a"):
        in_parallel([[("a", fails), ("never", lambda: pytest.fail("ran after its group failed"))], [("b", slow)]])
    assert ended.is_set()  # nothing still writes when the micro-batch's caches are released


def test_one_group_runs_on_the_callers_thread():
    assert in_parallel([[("a", lambda: threading.current_thread() is threading.main_thread())]]) == {"a": True}
