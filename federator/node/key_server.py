"""The node's end of the point lookup's node-to-node call (federator.query.wire, KEY_HELLO).

A routed point lookup needs one key's stored bytes from the partition's owner, which the
asking node decodes as it decodes its own (federator.sql.point). Over HTTP that call cost
the owner a request of its HTTP server (about 250 us of CPU on this machine, more than the
read); here it is a few struct packs on a connection the caller keeps open, served by one
thread per connection (a caller's thread keeps one of its own; an event loop sends all its
reads on one, without waiting for the answers before them)."""

from __future__ import annotations

import hmac
import logging
import socket
import threading
from typing import Any, Callable

from federator.query.position import Position, PositionBound
from federator.query.wire import (CALL_HELLO, KEY_ABSENT, KEY_CANNOT, KEY_FOUND, KEY_WELCOME, WATCH_BEAT_SECONDS,
                                  WATCH_HELLO, call_answer, exact_reader, key_answer, read_call_request, read_hello,
                                  split_key_request, watch_frame)
from federator.store.layer import StoredEntry
from federator.tls import Tls

log = logging.getLogger(__name__)
_UNBOUNDED = PositionBound.unbounded()
_READ_BYTES = 16384  # a request is tens of bytes: a larger read buys nothing but its allocation

ReadLocal = Callable[[str, int, bytes, PositionBound], "StoredEntry | None"]
# a StateQueryRequest's JSON -> (status, payload): the result stream, or the error body (Node.answer_call)
AnswerCall = Callable[[bytes], "tuple[int, bytes]"]
# what a positions watch reads: (epoch, (store, partition) -> offset) now (Node.answerable_offsets),
# and a wait for the next change (Materializer.wait_moved)
Watch = tuple[Callable[[], "tuple[int, dict[tuple[str, int], int]]"], Callable[[int, float], int]]


class KeyServer:
    """Serves ``read_local`` (Node.read_local) on host:port (0: any free port) to callers that
    open with ``secret``; ``topic_of`` names a store's changelog. Without a secret (a node that
    only listens on loopback and has no users: the node refuses to start otherwise) it answers
    any local caller."""

    def __init__(self, read_local: ReadLocal, topic_of: Callable[[str], str | None], secret: str | None,
                 host: str, port: int, tls: Tls | None = None, answer_call: AnswerCall | None = None,
                 watch: Watch | None = None) -> None:
        self._read_local, self._topic_of = read_local, topic_of
        self._answer_call = answer_call  # None: callers that open with CALL_HELLO are refused
        self._watch = watch  # None: callers that open with WATCH_HELLO are refused
        self._tls = tls  # callers then speak TLS (the node's certificate), as its HTTP callers do
        self._secret = (secret or "").encode()
        self._listener = socket.create_server((host, port), reuse_port=False)
        self.port: int = self._listener.getsockname()[1]
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False

    def start(self) -> None:
        threading.Thread(target=self._accept, name="key-server", daemon=True).start()

    def stop(self) -> None:
        """Stop accepting and end every connection (their callers take the general path)."""
        with self._lock:
            self._closed = True
            connections, self._connections = list(self._connections), set()
        _close(self._listener)
        for conn in connections:
            _close(conn)

    def _accept(self) -> None:
        while True:
            try:
                conn, peer = self._listener.accept()
            except OSError:
                return  # closed by stop()
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                if self._closed:
                    _close(conn)
                    return
                self._connections.add(conn)
            threading.Thread(target=self._serve, args=(conn, str(peer[0])), name="key-conn", daemon=True).start()

    def _serve(self, conn: socket.socket, peer: str) -> None:
        if self._tls is not None:
            try:  # the handshake here, on the connection's own thread: a slow caller holds only that
                conn.settimeout(10)
                plain, conn = conn, self._tls.server.wrap_socket(conn, server_side=True)
                conn.settimeout(None)
                with self._lock:
                    self._connections.discard(plain)
                    self._connections.add(conn)
            except (OSError, ValueError):
                log.warning("a key call from %s that did not complete a TLS handshake was refused", peer)
                with self._lock:
                    self._connections.discard(conn)
                _close(conn)
                return
        stream = conn.makefile("rb")
        read = exact_reader(stream)
        try:
            opened = read_hello(read)
            if opened is None or (self._secret and not hmac.compare_digest(opened[1].encode(), self._secret)):
                log.warning("a key call from %s without this node's cluster secret (or not a Federator node) "
                            "was refused", peer)
                return
            if opened[0] == WATCH_HELLO:
                if self._watch is None:
                    return
                conn.sendall(KEY_WELCOME)
                self._send_positions(conn, *self._watch)
                return
            if opened[0] == CALL_HELLO:
                if self._answer_call is None:
                    return
                conn.sendall(KEY_WELCOME)
                while True:
                    conn.sendall(call_answer(*self._answer_call(read_call_request(read))))
            conn.sendall(KEY_WELCOME)
            self._answer_keys(conn, stream)
        except (OSError, EOFError, ValueError):
            pass  # the caller went away (or spoke nonsense): its next call opens a new connection
        finally:
            stream.close()
            with self._lock:
                self._connections.discard(conn)
            _close(conn)

    def _answer_keys(self, conn: socket.socket, stream: Any) -> None:
        """Key requests answered in their order, those that arrived together in one send (an
        event loop's concurrent reads come on one connection), until the caller goes away."""
        buf = bytearray()
        while data := stream.read1(_READ_BYTES):
            buf += data
            answers = []
            while (got := split_key_request(buf)) is not None:
                request, size = got
                del buf[:size]
                answers.append(self._answer(*request))
            if answers:
                conn.sendall(b"".join(answers))

    def _send_positions(self, conn: socket.socket, current: Callable[[], tuple[int, dict[tuple[str, int], int]]],
                        wait_moved: Callable[[int, float], int]) -> None:
        """A positions watch (federator.query.wire, WATCH_HELLO): every change the moment it is
        made, and a beat when there is none. Until the caller goes away (or stop())."""
        sent: dict[tuple[str, int], int] = {}
        moves = wait_moved(-1, 0)
        while not self._closed:
            epoch, now = current()
            changes: list[tuple[str, int, int | None]] = [(s, p, o) for (s, p), o in now.items() if sent.get((s, p)) != o]
            changes += [(s, p, None) for (s, p) in sent if (s, p) not in now]
            conn.sendall(watch_frame(epoch, changes))
            sent = now
            moves = wait_moved(moves, WATCH_BEAT_SECONDS)

    def _answer(self, store: str, partition: int, key: bytes, at: int | None) -> bytes:
        topic = self._topic_of(store)
        if topic is None:
            return key_answer(KEY_CANNOT, None, None)
        bound = _UNBOUNDED if at is None else PositionBound.at(Position.of(topic, partition, at))
        try:
            entry = self._read_local(store, partition, key, bound)
        except Exception:  # noqa: BLE001 - a failed read is the general path's to explain
            log.exception("key read of store %r partition %d failed", store, partition)
            entry = None
        if entry is None:
            return key_answer(KEY_CANNOT, None, None)
        offset = entry.position.get(topic, partition)
        return key_answer(KEY_ABSENT if entry.stored is None else KEY_FOUND, offset, entry.stored)


def _close(sock: Any) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
