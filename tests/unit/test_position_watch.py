"""The positions watch on a node's key port (federator.query.wire, WATCH_HELLO): a KeyServer on
loopback, its positions from a small fake, and the caller's PositionWatch."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, Callable, Iterator

import pytest

from federator.dispatch import position_watch
from federator.dispatch.position_watch import PositionWatch
from federator.node.key_server import KeyServer
from federator.query.wire import KEY_WELCOME, read_hello, watch_frame


class Positions:
    """What a node would answer as its current active copies, moved by the test, and its
    change count to wait on (as Node.answerable_offsets and Materializer.wait_moved give them)."""

    def __init__(self) -> None:
        self.epoch = 0
        self.offsets: dict[tuple[str, int], int] = {}
        self._moved = threading.Condition()
        self._moves = 0

    def current(self) -> tuple[int, dict[tuple[str, int], int]]:
        with self._moved:
            return self.epoch, dict(self.offsets)

    def move(self, change: Callable[[Positions], Any]) -> None:
        with self._moved:
            change(self)
            self._moves += 1
            self._moved.notify_all()

    def wait_moved(self, seen: int, timeout: float) -> int:
        with self._moved:
            if seen >= 0 and self._moves == seen:
                self._moved.wait(timeout)
            return self._moves


@pytest.fixture
def served() -> Iterator[tuple[Positions, KeyServer]]:
    positions = Positions()
    positions.offsets = {("scores", 0): 41, ("scores", 1): -1}
    server = KeyServer(lambda *a: None, lambda store: None, "s3cret", "127.0.0.1", 0,
                       watch=(positions.current, positions.wait_moved))
    server.start()
    yield positions, server
    server.stop()


def until(cond: Callable[[], Any], timeout: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.01)
    raise AssertionError("not within the time")


def test_a_watch_follows_every_change_the_node_reports(served) -> None:
    positions, server = served
    watch = PositionWatch(f"127.0.0.1:{server.port}", "s3cret")
    try:
        first = until(lambda: watch.offset("scores", 0))
        assert first[1] == 41 and watch.offset("scores", 1) == (first[0], -1)  # -1: an empty shard
        assert watch.offset("scores", 2) is None and watch.offset("other", 0) is None
        positions.move(lambda p: p.offsets.update({("scores", 0): 42}))
        assert until(lambda: (got := watch.offset("scores", 0)) and got[1] == 42 and got) == (first[0], 42)
        positions.move(lambda p: p.offsets.pop(("scores", 1)))  # handed over, or no longer current
        until(lambda: watch.offset("scores", 1) is None)
        positions.move(lambda p: setattr(p, "epoch", 7))  # a copy reset: the same offset is another state
        moved = until(lambda: (got := watch.offset("scores", 0)) and got[0] != first[0] and got)
        assert moved[1] == 42
        server.stop()  # the node goes away: nothing it said counts any more
        until(lambda: watch.offset("scores", 0) is None)
    finally:
        watch.close()


def test_a_watch_without_the_cluster_secret_learns_nothing(served) -> None:
    _, server = served
    watch = PositionWatch(f"127.0.0.1:{server.port}", "wrong")
    try:
        time.sleep(0.5)
        assert watch.offset("scores", 0) is None
    finally:
        watch.close()


def test_a_node_that_goes_silent_is_not_trusted(monkeypatch) -> None:
    """A node stopped (SIGSTOP, a cut cable) keeps its connection open and says nothing: past a
    few beats' time its last word is dropped."""
    monkeypatch.setattr(position_watch, "_TRUSTED_FOR", 0.3)
    listener = socket.create_server(("127.0.0.1", 0))
    done = threading.Event()

    def silent() -> None:
        conn, _ = listener.accept()
        stream = conn.makefile("rb")
        read_hello(lambda n: stream.read(n))
        conn.sendall(KEY_WELCOME + watch_frame(3, [("scores", 0, 9)]))
        done.wait(5)  # then nothing, connection open
        conn.close()

    threading.Thread(target=silent, daemon=True).start()
    watch = PositionWatch(f"127.0.0.1:{listener.getsockname()[1]}")
    try:
        assert until(lambda: watch.offset("scores", 0))[1] == 9
        until(lambda: watch.offset("scores", 0) is None, timeout=2)
    finally:
        done.set()
        watch.close()
        listener.close()


def test_a_watch_nobody_asks_stops_once_its_node_is_gone(served, monkeypatch) -> None:
    """A node that moved to another port, or left, leaves no thread retrying it for ever."""
    monkeypatch.setattr(position_watch, "_UNASKED_SECONDS", 0.2)
    _, server = served
    watch = PositionWatch(f"127.0.0.1:{server.port}", "s3cret")
    assert until(lambda: watch.offset("scores", 0))
    server.stop()
    time.sleep(0.3)  # unasked meanwhile
    until(lambda: watch.closed, timeout=3)


def test_a_watch_speaks_tls_to_a_node_that_does(tmp_path) -> None:
    """With --tls-cert the key port speaks TLS, the watch too; a watch without TLS learns nothing."""
    from federator.tls import Tls
    from tests.certificates import make_certificate

    tls = Tls(*make_certificate(tmp_path))
    positions = Positions()
    positions.offsets = {("scores", 3): 5}
    server = KeyServer(lambda *a: None, lambda store: None, None, "127.0.0.1", 0, tls,
                       watch=(positions.current, positions.wait_moved))
    server.start()
    secure, plain = PositionWatch(f"127.0.0.1:{server.port}", None, tls), PositionWatch(f"127.0.0.1:{server.port}")
    try:
        assert until(lambda: secure.offset("scores", 3))[1] == 5
        assert plain.offset("scores", 3) is None
    finally:
        secure.close()
        plain.close()
        server.stop()


def test_a_wait_for_an_offset_ends_when_the_node_says_it_reached_it_and_not_before(served) -> None:
    positions, server = served
    watch = PositionWatch(f"127.0.0.1:{server.port}", "s3cret")
    try:
        until(lambda: watch.offset("scores", 0))
        assert watch.wait_reached("scores", 0, 41, time.monotonic() + 5)  # there already
        started = time.monotonic()
        assert not watch.wait_reached("scores", 0, 45, started + 0.2)  # nobody moves it: waits it out
        assert time.monotonic() - started >= 0.2
        threading.Timer(0.1, lambda: positions.move(lambda p: p.offsets.update({("scores", 0): 45}))).start()
        started = time.monotonic()
        assert watch.wait_reached("scores", 0, 45, started + 5)
        assert time.monotonic() - started < 2  # woken by the frame, not at the end of the wait
        assert not watch.wait_reached("scores", 3, 0, time.monotonic() + 0.05)  # a partition it does not answer
    finally:
        watch.close()
