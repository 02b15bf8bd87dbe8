"""The caller's end of a node's key port (federator.query.wire): the point lookup (KeyClient,
KEY_HELLO) and the per-partition query of a scatter-gather (CallClient, CALL_HELLO); one
connection per calling thread and kind, kept open."""

from __future__ import annotations

import functools
import json
import socket
import threading
import time
from typing import IO, Callable

from federator.query.position import Position
from federator.dispatch.client import NodeCallError
from federator.query.request import StateQueryRequest
from federator.query.result import QueryResult
from federator.query.wire import (KEY_ABSENT, KEY_FOUND, KEY_WELCOME, call_hello, call_request, decode_results,
                                  exact_reader, key_hello, key_request, read_call_answer, read_key_answer)
from federator.store.layer import StoredEntry
from federator.tls import Tls


def address_of(endpoint: str) -> tuple[str, int]:
    """(host, port) of a node's ``host:port`` key endpoint (an IPv6 host in brackets)."""
    host, _, port = endpoint.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


def entry_of(answer: tuple[int, int | None, bytes | None], topic: str, partition: int) -> StoredEntry | None:
    """The stored entry a key port's answer (``read_key_answer``) carries; None when the node
    could not answer so (the caller takes the general path)."""
    status, offset, stored = answer
    if status not in (KEY_FOUND, KEY_ABSENT):
        return None
    return StoredEntry(stored, Position() if offset is None else _position(topic, partition, offset))


# the partition's Position last read from its owner, given again while its offset stays: its
# token is then made once, not for every routed read of a partition nobody writes
_LAST: dict[tuple[str, int], Position] = {}


def _position(topic: str, partition: int, offset: int) -> Position:
    last = _LAST.get((topic, partition))
    if last is None or last.get(topic, partition) != offset:
        last = _LAST[(topic, partition)] = Position.of(topic, partition, offset)
    return last


class _PortClient:
    """Connections to one node's key port, one per calling thread, opened with ``hello``."""

    def __init__(self, endpoint: str, hello: bytes, tls: Tls | None = None) -> None:
        self.endpoint = endpoint
        self._address = address_of(endpoint)
        self._tls = tls  # the calling node's: the connection is TLS and the peer's certificate checked
        self._hello = hello
        self._local = threading.local()

    def _connection(self, timeout: float) -> tuple[socket.socket, Callable[[int], bytes]]:
        held = getattr(self._local, "held", None)
        if held is not None:
            return held[0], held[2]
        sock = socket.create_connection(self._address, timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._tls is not None:
            try:
                sock = self._tls.client.wrap_socket(sock, server_hostname=self._address[0])
            except BaseException:
                sock.close()
                raise
        stream: IO[bytes] = sock.makefile("rb")
        read = exact_reader(stream)
        try:
            sock.sendall(self._hello)
            if read(len(KEY_WELCOME)) != KEY_WELCOME:
                raise EOFError("refused")
        except BaseException:
            stream.close()
            sock.close()
            raise
        self._local.held = (sock, stream, read)
        return sock, read

    def _drop(self) -> None:
        held = getattr(self._local, "held", None)
        self._local.held = None
        if held is not None:
            held[1].close()
            held[0].close()


class KeyClient(_PortClient):
    def __init__(self, endpoint: str, cluster_secret: str | None = None, tls: Tls | None = None) -> None:
        super().__init__(endpoint, key_hello(cluster_secret), tls)

    def read_key(self, store: str, topic: str, partition: int, key: bytes, at: int | None,
                 timeout: float) -> StoredEntry | None:
        """``key``'s stored entry from the node's active, current copy of the partition (at
        least at offset ``at``), as ``Node.read_local`` gives it there; None when the node
        cannot answer it so, or does not answer: the caller takes the general path, which
        retries elsewhere and says why when it cannot."""
        request = key_request(store, partition, key, at)
        for attempt in (0, 1):  # a kept connection the node closed fails once: open another
            try:
                sock, read = self._connection(timeout)
                sock.settimeout(timeout)
                sock.sendall(request)
                answer = read_key_answer(read)
            except TimeoutError:  # not again: the time is spent
                self._drop()
                return None
            except (OSError, EOFError, ValueError):
                self._drop()
                if attempt:
                    return None
                continue
            return entry_of(answer, topic, partition)
        return None


class CallUnavailable(ConnectionError):
    """The call port could not be used (refused, closed, not a Federator node): the caller asks
    over HTTP instead, as before the port existed."""


class CallClient(_PortClient):
    def __init__(self, endpoint: str, cluster_secret: str | None = None, tls: Tls | None = None) -> None:
        super().__init__(endpoint, call_hello(cluster_secret), tls)

    def query(self, request: StateQueryRequest, timeout: float) -> list[QueryResult]:
        """The node's per-partition results for ``request``, as ``POST /internal/v1/query``
        gives them. NodeCallError for an error answer or a call that ran past ``timeout``;
        CallUnavailable when the port cannot take the call."""
        return self.send(request, timeout)()

    def send(self, request: StateQueryRequest, timeout: float) -> _Pending:
        """Send ``request`` now and return what reads its answer (as ``query`` gives it), so
        a caller with calls to several nodes sends them all, does its own part, then reads:
        the owners work meanwhile, and no thread is handed the call. One call at a time per
        node and thread: read the answer (or ``abandon`` it) before this thread sends this
        client another request."""
        return self._send(call_request(json.dumps(request.to_dict()).encode()), timeout)

    def _send(self, body: bytes, timeout: float) -> _Pending:
        deadline = time.monotonic() + timeout
        fresh = getattr(self._local, "held", None) is None
        try:
            sock, read = self._connection(timeout)
            sock.settimeout(timeout)
            sock.sendall(body)
        except (OSError, EOFError, ValueError) as e:
            return self._failed(e, body, deadline, timeout, fresh)
        return _Pending(self, functools.partial(self._answer, sock, read, body, deadline, timeout, fresh))

    def _failed(self, e: Exception, body: bytes, deadline: float, timeout: float, fresh: bool) -> _Pending:
        """After a call failed on this thread's connection: the call sent again on a new one
        when the failed one was kept from before (the node may have closed it meanwhile;
        reads may be asked twice), else the error that says why."""
        self._drop()
        if isinstance(e, TimeoutError):  # not again: the time is spent
            raise NodeCallError(self.endpoint, f"no answer within {timeout:.2f}s") from None
        if fresh:
            raise CallUnavailable(f"{self.endpoint}: {type(e).__name__}: {e}") from None
        return self._send(body, max(0.001, deadline - time.monotonic()))

    def _answer(self, sock: socket.socket, read: Callable[[int], bytes], body: bytes, deadline: float,
                timeout: float, fresh: bool) -> list[QueryResult]:
        try:
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            status, payload = read_call_answer(read)
        except (OSError, EOFError, ValueError) as e:
            return self._failed(e, body, deadline, timeout, fresh)()
        if status != 200:
            try:
                err = json.loads(payload)["error"]
                code, message = err["code"], err["message"]
            except (ValueError, KeyError, TypeError):
                code, message = None, payload[:200].decode("utf-8", "replace")
            raise NodeCallError(self.endpoint, f"status {status} {code}: {message}", status, code)
        return decode_results(payload)


class _Pending:
    """A call sent on this thread's connection: calling it reads the answer; ``abandon``
    closes the connection instead (its answer would otherwise be read as the next call's)."""

    def __init__(self, client: CallClient, read: Callable[[], list[QueryResult]]) -> None:
        self._client, self._read = client, read
        self._done = False

    def __call__(self) -> list[QueryResult]:
        self._done = True
        return self._read()

    def abandon(self) -> None:
        if not self._done:
            self._done = True
            self._client._drop()
