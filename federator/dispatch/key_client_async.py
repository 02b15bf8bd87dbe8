"""The caller's end of the point lookup's key port (federator.query.wire, KEY_HELLO) on an
asyncio event loop: a routed point read made by the loop that serves HTTP, with no thread.

The loop's requests share the connections kept to one node's port, one request at a time on
each: an idle one is taken, else another opened, up to MOST_CONNECTIONS (past that a request
waits for one to be free). Answers as ``KeyClient.read_key`` gives them.
"""

from __future__ import annotations

import asyncio
from typing import Callable

from federator.dispatch.key_client import address_of, entry_of
from federator.query.wire import KEY_WELCOME, key_hello, key_request, split_key_answer
from federator.store.layer import StoredEntry
from federator.tls import Tls

# connections kept to one node at most: each is a thread at that node's key server, and the
# loop's requests seldom wait on more at once than a thread pool would have made calls
MOST_CONNECTIONS = 16

_Answer = tuple[int, "int | None", "bytes | None"]


class AsyncKeyClient:
    """Kept connections to one node's key port, for the event loop it is made on."""

    def __init__(self, endpoint: str, cluster_secret: str | None = None, tls: Tls | None = None,
                 most: int = MOST_CONNECTIONS) -> None:
        self.endpoint = endpoint
        self.loop = asyncio.get_running_loop()
        self._address = address_of(endpoint)
        self._hello = key_hello(cluster_secret)
        self._tls = tls  # the calling node's: the connection is TLS and the peer's certificate checked
        self._idle: list[_KeyConnection] = []
        self._room = asyncio.Semaphore(most)

    async def read_key(self, store: str, topic: str, partition: int, key: bytes, at: int | None,
                       timeout: float) -> StoredEntry | None:
        """``KeyClient.read_key``: ``key``'s stored entry from the node's active, current copy
        (at least at offset ``at``); None when the node cannot answer it so, does not answer, or
        not within ``timeout`` seconds."""
        try:
            async with asyncio.timeout(timeout), self._room:
                answer = await self._ask(key_request(store, partition, key, at))
        except TimeoutError:
            return None
        return None if answer is None else entry_of(answer, topic, partition)

    async def _ask(self, request: bytes) -> _Answer | None:
        for _ in (0, 1):  # a kept connection the node closed fails once: open another
            conn = self._take()
            try:
                if conn is None:
                    conn = await self._open()
                answer = await conn.ask(request)
            except (OSError, EOFError, ValueError):  # ssl.SSLError is an OSError
                if conn is not None:
                    conn.close()
                continue
            except BaseException:  # cancelled or out of time: its answer must not be read as another's
                if conn is not None:
                    conn.close()
                raise
            self._idle.append(conn)
            return answer
        return None

    def _take(self) -> _KeyConnection | None:
        """The connection used last that is still open (its socket's buffers are warm)."""
        while self._idle:
            conn = self._idle.pop()
            if conn.usable:
                return conn
        return None

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
    """One connection to a key port: a request written, its answer read as it comes."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.usable = True
        self._buf = bytearray()
        self._waiter: asyncio.Future | None = None
        self._split: Callable[[bytearray], tuple[object, int] | None] = _welcome

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done():  # bytes nobody asked for: not a node that speaks the port
            self.close()
            return
        self._buf += data
        got = self._split(self._buf)
        if got is not None:
            del self._buf[:got[1]]
            self._waiter = None
            waiter.set_result(got[0])

    def connection_lost(self, exc: Exception | None) -> None:
        self.usable = False
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(EOFError("the node closed the connection"))

    async def ask(self, request: bytes) -> _Answer:
        return await self.exchange(request, split_key_answer)  # type: ignore[return-value]

    async def exchange(self, data: bytes, split: Callable[[bytearray], tuple[object, int] | None]) -> object:
        """``data`` written, and what ``split`` reads of the answer."""
        if not self.usable or self.transport is None:
            raise EOFError("the connection is closed")
        self._split = split
        self._waiter = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return await self._waiter

    def close(self) -> None:
        self.usable = False
        if self.transport is not None:
            self.transport.close()
