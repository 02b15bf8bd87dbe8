"""The caller's end of a node's positions watch (federator.query.wire, WATCH_HELLO): the offsets
another node's partitions are at, as it says them, kept current by one thread per node.

A statement's answer over partitions still at the offsets it was computed at is that answer
again, so the node that computed it may give it without asking the owners (see
``federator.sql.engine``). Only what the owner said on a connection that is still open and heard
from within a few beats counts: anything else is unknown, and unknown means ask."""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import IO

from federator.query.wire import (KEY_WELCOME, WATCH_BEAT_SECONDS, exact_reader, read_watch_frame,
                                  watch_hello)
from federator.tls import Tls

log = logging.getLogger(__name__)
_TRUSTED_FOR = 3 * WATCH_BEAT_SECONDS  # silent longer than this: the node may be stopped or cut off
_RETRY_SECONDS = 0.5
_UNASKED_SECONDS = 60.0  # a watch nobody asked for this long stops at its next failure (a node gone)


class PositionWatch:
    """The positions of the partitions ``endpoint`` (a key port) answers as their active copy."""

    def __init__(self, endpoint: str, secret: str | None = None, tls: Tls | None = None) -> None:
        host, _, port = endpoint.rpartition(":")
        self.endpoint = endpoint
        self._address = (host.strip("[]") or "127.0.0.1", int(port))
        self._hello = watch_hello(secret)
        self._tls = tls
        # ((this watch's connection count, the node's epoch), offsets), replaced whole per frame
        # so a reader holds one frame's: an offset names one state only under both (a node
        # restarted, or a shard reset, starts offsets over)
        self._state: tuple[tuple[int, int], dict[tuple[str, int], int]] | None = None
        self._heard = 0.0
        self._asked = time.monotonic()
        self._connections = 0
        self._closed = threading.Event()
        self._moved = threading.Condition()  # notified at each frame heard
        self._sock: socket.socket | None = None
        self._thread = threading.Thread(target=self._run, name=f"watch-{endpoint}", daemon=True)
        self._thread.start()

    def offset(self, store: str, partition: int) -> tuple[tuple[int, int], int] | None:
        """(epoch, offset) the node last said the partition is at (offset -1: nothing applied);
        None when it does not answer it as the active copy, or has not been heard from lately."""
        self._asked = now = time.monotonic()
        state = self._state
        if state is None or now - self._heard > _TRUSTED_FOR:
            return None
        offset = state[1].get((store, partition))
        return None if offset is None else (state[0], offset)

    def wait_reached(self, store: str, partition: int, offset: int, until: float) -> bool:
        """Whether the node says the partition has applied ``offset``, waiting for its frames
        until ``until`` (time.monotonic()) at most: a consistency token's read asked again the
        moment its owner caught up, not after a blind back-off."""
        with self._moved:
            while True:
                said = self.offset(store, partition)
                if said is not None and said[1] >= offset:
                    return True
                left = until - time.monotonic()
                if left <= 0 or self._closed.is_set():
                    return False
                self._moved.wait(left)

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def close(self) -> None:
        self._closed.set()
        sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _run(self) -> None:
        while not self._closed.is_set():
            try:
                self._follow()
            except (OSError, EOFError, ValueError) as e:
                log.debug("positions watch of %s ended: %s", self.endpoint, e)
            self._forget()
            if time.monotonic() - self._asked > _UNASKED_SECONDS:
                self._closed.set()  # its node moved or left: the next ask opens a new watch
            self._closed.wait(_RETRY_SECONDS)

    def _forget(self) -> None:
        self._state = None

    def _follow(self) -> None:
        sock = socket.create_connection(self._address, timeout=10)
        try:
            if self._tls is not None:
                sock = self._tls.client.wrap_socket(sock, server_hostname=self._address[0])
            self._sock = sock
            if self._closed.is_set():
                return
            stream: IO[bytes] = sock.makefile("rb")
            read = exact_reader(stream)
            sock.sendall(self._hello)
            if read(len(KEY_WELCOME)) != KEY_WELCOME:
                raise EOFError("refused")
            sock.settimeout(_TRUSTED_FOR)  # a node that stops beating is left
            self._connections += 1
            offsets: dict[tuple[str, int], int] = {}
            while not self._closed.is_set():
                epoch, changes = read_watch_frame(read)
                for store, partition, offset in changes:
                    if offset is None:
                        offsets.pop((store, partition), None)
                    else:
                        offsets[(store, partition)] = offset
                self._heard = time.monotonic()
                self._state = ((self._connections, epoch), dict(offsets))
                with self._moved:
                    self._moved.notify_all()
        finally:
            self._sock = None
            sock.close()
