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

_Answer = tuple[int, "int | None", "bytes | None"]


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
        try:
            async with asyncio.timeout(timeout):
                answer = await self._ask(key_request(store, partition, key, at))
        except TimeoutError:
            return None
        return None if answer is None else entry_of(answer, topic, partition)

    async def _ask(self, request: bytes) -> _Answer | None:
        for _ in (0, 1):  # a kept connection the node closed fails once: open another
            try:
                conn = self._conn if self._conn is not None and self._conn.usable else await self._connected()
                return await conn.ask(request)
            except (OSError, EOFError, ValueError):  # ssl.SSLError is an OSError
                continue
        return None

    async def _connected(self) -> _KeyConnection:
        """The kept connection, opened again if the node closed it: once for all the requests
        that find none."""
        async with self._opening:
            if self._conn is None or not self._conn.usable:
                self._conn = await self._open()
            return self._conn

    async def _open(self) -> _KeyConnection:
        host, port = self._address
        context = self._tls.client if self._tls is not None else None
        _, conn = await self.loop.create_connection(_KeyConnection, host, port, ssl=context,
                                                    server_hostname=host if context is not None else None)
        try:
            if await conn.exchange(self._hello, _welcome) != KEY_WELCOME:
                raise EOFError("the node refused the key call")
        except BaseException:
            conn.close()
            raise
        return conn


def _welcome(buf: bytearray) -> tuple[bytes, int] | None:
    return (bytes(buf[:len(KEY_WELCOME)]), len(KEY_WELCOME)) if len(buf) >= len(KEY_WELCOME) else None


class _KeyConnection(asyncio.Protocol):
    """One connection to a key port: requests written as they come (those of one turn of the
    loop in one write), their answers read in order as they come."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.usable = True
        self._buf = bytearray()
        # (how an answer is read, who waits for it), oldest first; a waiter that gave up (its
        # request's timeout) stays until its answer comes, which is then dropped
        self._waiting: deque[tuple[Callable[[bytearray], tuple[object, int] | None], asyncio.Future]] = deque()
        self._unsent: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if not self._waiting:  # bytes nobody asked for: not a node that speaks the port
            self.close()
            return
        self._buf += data
        while self._waiting:
            split, waiter = self._waiting[0]
            got = split(self._buf)
            if got is None:
                return
            del self._buf[:got[1]]
            self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(got[0])

    def connection_lost(self, exc: Exception | None) -> None:
        self.usable = False
        for _, waiter in self._waiting:
            if not waiter.done():
                waiter.set_exception(EOFError("the node closed the connection"))
        self._waiting.clear()

    async def ask(self, request: bytes) -> _Answer:
        return await self.exchange(request, split_key_answer)  # type: ignore[return-value]

    async def exchange(self, data: bytes, split: Callable[[bytearray], tuple[object, int] | None]) -> object:
        """``data`` sent, and what ``split`` reads of its answer."""
        if not self.usable or self.transport is None:
            raise EOFError("the connection is closed")
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        self._waiting.append((split, waiter))
        if not self._unsent:
            loop.call_soon(self._send)
        self._unsent.append(data)
        return await waiter

    def _send(self) -> None:
        data, self._unsent = b"".join(self._unsent), []
        if self.usable and self.transport is not None:
            self.transport.write(data)

    def close(self) -> None:
        self.usable = False
        if self.transport is not None:
            self.transport.close()
