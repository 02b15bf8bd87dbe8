"""Partition answers a receiver keeps while their partitions stay where they were computed.

A query whose answer does not depend on the statement's values (a partition's whole score
index, say) is asked again and again by statements that differ only in those values (each
player's rank). Its answer from one partition at one offset is the same however often it is
asked, so the receiver keeps it and gives it again while the partition's owner says, on its
positions watch, that the partition is still at that offset in the same epoch (see
``federator.dispatch.position_watch``): no call is made. Any write, epoch change, silent
watch or age past ``max_age`` means ask.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any, Hashable

import pyarrow as pa

from federator.settings import PARTITION_ANSWER_SHARE, NodeSettings

MAX_BYTES = NodeSettings.partition_answers_mb << 20  # all kept answers together, least recently used dropped first


class PartitionAnswers:
    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        """``max_bytes``: all the answers together (--partition-answers-mb; 0 keeps none). One
        answer larger than a share of it costs more to hold than to ask for again."""
        self.max_bytes, self.max_entry_bytes = max_bytes, max_bytes // PARTITION_ANSWER_SHARE
        # key -> (kept at, the partition's state then, its offset or None, the batch or None)
        self._answers: OrderedDict[Hashable, tuple[float, Any, int | None, pa.RecordBatch | None]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable, state: Any, max_age: float) -> tuple[int | None, pa.RecordBatch | None] | None:
        """(offset, batch) kept for ``key`` at ``state``, if no older than ``max_age`` seconds."""
        with self._lock:
            kept = self._answers.get(key)
            if kept is None:
                return None
            if kept[1] != state or time.monotonic() - kept[0] > max_age:
                self._drop(key)
                return None
            self._answers.move_to_end(key)
            return kept[2], kept[3]

    def put(self, key: Hashable, state: Any, offset: int | None, batch: pa.RecordBatch | None) -> None:
        size = batch.get_total_buffer_size() if batch is not None else 0
        if size > self.max_entry_bytes or self.max_bytes == 0:
            return
        with self._lock:
            self._drop(key)
            self._answers[key] = (time.monotonic(), state, offset, batch)
            self._bytes += size
            while self._bytes > self.max_bytes and self._answers:
                self._drop(next(iter(self._answers)))

    def _drop(self, key: Hashable) -> None:
        kept = self._answers.pop(key, None)
        if kept is not None and kept[3] is not None:
            self._bytes -= kept[3].get_total_buffer_size()

    def state_of(self, key: Hashable) -> Any:
        """The partition's state ``key``'s answer was kept at (None: none kept), however old."""
        kept = self._answers.get(key)
        return None if kept is None else kept[1]

    def __len__(self) -> int:
        return len(self._answers)
