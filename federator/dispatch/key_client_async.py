"""The caller's end of the point lookup's key port (federator.query.wire, KEY_HELLO) on an
asyncio event loop: a routed point read made by the loop that serves HTTP, with no thread.

The loop's requests to one node share one kept connection, sent as they come without waiting
for the answers before them (the node answers in order); those made in one turn of the loop
go in one write, and the node answers those that arrived together in one send. So ten
concurrent reads cost the node one wake-up, not ten threads woken in turn. Answers as
``KeyClient.read_key`` gives them.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Callable

from federator.dispatch.key_client import address_of, entry_of
from federator.query.wire import KEY_WELCOME, key_hello, key_request, split_key_answer
from federator.store.layer import StoredEntry
from federator.tls import Tls

class AsyncKeyClient:
    """A kept connection to one node's key port, for the event loop it is made on."""

    def __init__(self, endpoint: str, cluster_secret: str | None = None, tls: Tls | None = None) -> None:
        self.endpoint = endpoint
        self.loop = asyncio.get_running_loop()
        self._address = address_of(endpoint)
        self._hello = key_hello(cluster_secret)
        self._tls = tls  # the calling node's: the connection is TLS and the peer's certificate checked
        self._conn: _KeyConnection | None = None
        self._opening = asyncio.Lock()

    async def read_key(self, store: str, topic: str, partition: int, key: bytes, at: int | None,
                       timeout: float) -> StoredEntry | None:
        """``KeyClient.read_key``: ``key``'s stored entry from the node's active, current copy
        (at least at offset ``at``); None when the node cannot answer it so, does not answer, or
        not within ``timeout`` seconds."""
        deadline = self.loop.time() + timeout
        for _ in (0, 1):  # a kept connection the node closed fails once: open another
            try:
                conn = self._conn if self._conn is not None and self._conn.usable else await self._connected(deadline)
                answer = await conn.exchange(key_request(store, partition, key, at), split_key_answer, deadline)
            except TimeoutError:  # (an OSError too) no connection in time: the caller does without
                return None
            except (OSError, EOFError, ValueError):  # ssl.SSLError is an OSError
                continue
            return None if answer is None else entry_of(answer, topic, partition)  # type: ignore[arg-type]
        return None

    async def _connected(self, deadline: float) -> _KeyConnection:
        """The kept connection, opened again if the node closed it: once for all the requests
        that find none. By ``deadline`` (the loop's time), or TimeoutError."""
        async with asyncio.timeout_at(deadline):
            async with self._opening:
                if self._conn is None or not self._conn.usable:
                    self._conn = await self._open(deadline)
                return self._conn

    async def _open(self, deadline: float) -> _KeyConnection:
        host, port = self._address
        context = self._tls.client if self._tls is not None else None
        _, conn = await self.loop.create_connection(_KeyConnection, host, port, ssl=context,
                                                    server_hostname=host if context is not None else None)
        try:
            if await conn.exchange(self._hello, _welcome, deadline) != KEY_WELCOME:
                raise EOFError("the node refused the key call")
        except BaseException:
            conn.close()
            raise
        return conn


def _welcome(buf: bytearray) -> tuple[bytes, int] | None:
    return (bytes(buf[:len(KEY_WELCOME)]), len(KEY_WELCOME)) if len(buf) >= len(KEY_WELCOME) else None


class _KeyConnection(asyncio.Protocol):
    """One connection to a key port: requests written as they come (those of one turn of the
    loop in one write), their answers read in order as they come. A request not answered by its
    deadline gets None; one timer per connection finds them (a timer per request cost more than
    the rest of the read)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.usable = True
        self._buf = bytearray()
        # (how an answer is read, who waits for it, by when), oldest first; a waiter that gave up
        # (its deadline) stays until its answer comes, which is then dropped
        self._waiting: deque[tuple[Callable[[bytearray], tuple[object, int] | None], asyncio.Future, float]] = deque()
        self._unsent: list[bytes] = []
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if not self._waiting:  # bytes nobody asked for: not a node that speaks the port
            self.close()
            return
        self._buf += data
        while self._waiting:
            split, waiter, _ = self._waiting[0]
            got = split(self._buf)
            if got is None:
                return
            del self._buf[:got[1]]
            self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(got[0])

    def connection_lost(self, exc: Exception | None) -> None:
        self.usable = False
        for _, waiter, _ in self._waiting:
            if not waiter.done():
                waiter.set_exception(EOFError("the node closed the connection"))
        self._waiting.clear()
        if self._timer is not None:
            self._timer.cancel()

    async def exchange(self, data: bytes, split: Callable[[bytearray], tuple[object, int] | None],
                       deadline: float) -> object:
        """``data`` sent, and what ``split`` reads of its answer; None when it has not come by
        ``deadline`` (the loop's time)."""
        if not self.usable or self.transport is None:
            raise EOFError("the connection is closed")
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        self._waiting.append((split, waiter, deadline))
        if self._timer is None or deadline < self._timer.when():
            self._watch(loop, deadline)
        if not self._unsent:
            loop.call_soon(self._send)
        self._unsent.append(data)
        return await waiter

    def _watch(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_at(when, self._expire, loop)

    def _expire(self, loop: asyncio.AbstractEventLoop) -> None:
        """Each waiter past its deadline answered None; the timer set for the next deadline."""
        self._timer = None
        now, next_at = loop.time(), None
        for _, waiter, deadline in self._waiting:
            if waiter.done():
                continue
            if deadline <= now:
                waiter.set_result(None)
            elif next_at is None or deadline < next_at:
                next_at = deadline
        if next_at is not None:
            self._watch(loop, next_at)

    def _send(self) -> None:
        data, self._unsent = b"".join(self._unsent), []
        if self.usable and self.transport is not None:
            self.transport.write(data)

    def close(self) -> None:
        self.usable = False
        if self.transport is not None:
            self.transport.close()
