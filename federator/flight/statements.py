"""Server-side state of Flight SQL calls: prepared statements and executed results awaiting DoGet.

Both live in memory on the node that created them (a Flight SQL client talks to one endpoint),
bounded in number and idle time so clients that never close a handle cannot grow the node.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Generic, Iterator, TypeVar

import pyarrow as pa

T = TypeVar("T")


class Expiring(Generic[T]):
    """handle -> value, dropping the least recently used past ``limit`` and anything idle for ``ttl`` s."""

    def __init__(self, limit: int, ttl: float) -> None:
        self.limit, self.ttl = limit, ttl
        self._items: OrderedDict[bytes, tuple[float, T]] = OrderedDict()
        self._lock = threading.Lock()

    def _expire(self, now: float) -> None:
        while self._items:
            handle, (used, _) = next(iter(self._items.items()))
            if now - used <= self.ttl and len(self._items) <= self.limit:
                break
            del self._items[handle]

    def add(self, value: T) -> bytes:
        handle = uuid.uuid4().bytes
        now = time.monotonic()
        with self._lock:
            self._items[handle] = (now, value)
            self._expire(now)
        return handle

    def get(self, handle: bytes) -> T | None:
        now = time.monotonic()
        with self._lock:
            self._expire(now)
            item = self._items.get(handle)
            if item is None:
                return None
            self._items[handle] = (now, item[1])  # used again: idle time starts over
            self._items.move_to_end(handle)
            return item[1]

    def pop(self, handle: bytes) -> T | None:
        with self._lock:
            self._expire(time.monotonic())
            item = self._items.pop(handle, None)
            return None if item is None else item[1]

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


@dataclass
class PreparedStatement:
    sql: str
    param_count: int
    # One list of values per execution, bound by DoPut; None until parameters are bound.
    parameter_rows: list[list[Any]] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


@dataclass
class PendingResult:
    """An executed query whose batches wait for the DoGet of its ticket."""

    schema: pa.Schema
    batches: Iterator[pa.RecordBatch]
    consistency_token: str | None
