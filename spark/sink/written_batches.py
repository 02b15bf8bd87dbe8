"""Which stores each micro-batch of a streaming query has written, kept beside its checkpoint.

Spark records a micro-batch as done (``<checkpoint>/commits/<batch id>``) only after the sink
has written it. A query stopped in between runs that micro-batch again on restart, over the
same input. Its stores already hold that answer, so writing it again would only put the same
records into their changelogs a second time. ``<checkpoint>/federator-commits/<batch id>.json``
(store -> the consistency token of its write) is written right after each store's write ends,
and a store named there is not written again by that micro-batch: each micro-batch's records
go into each changelog once. A write stopped before it ended is written again, whole: its
first records are then in the changelog twice (the same upserts, so the store ends the same).

Spark's tasks read the record too (the format's stream writer), so the checkpoint must be on a
file system they reach (``federator_spark.sink.checkpoint_files``).
"""

from __future__ import annotations

import threading
from typing import Any

from federator_spark.sink.checkpoint_files import CheckpointFiles

FOLDER = "federator-commits"
KEPT = 100  # micro-batches whose records are kept; Spark runs again only its latest one


class WrittenBatches:
    """The stores each micro-batch of the query checkpointed at ``checkpoint`` has written."""

    def __init__(self, checkpoint: str) -> None:
        self._files = CheckpointFiles(checkpoint, FOLDER)
        self.location = self._files.location
        self._lock = threading.Lock()  # stores of one micro-batch record from threads of their own

    def of(self, batch_id: int) -> dict[str, str]:
        """store -> token of the stores micro-batch ``batch_id`` has written."""
        return dict(self._files.read(batch_id) or {})

    def record(self, batch_id: int, store: str, token: str) -> None:
        """``store``'s write of micro-batch ``batch_id`` has ended, at ``token``."""
        with self._lock:
            self._files.write(batch_id, {**self.of(batch_id), store: token})
            if batch_id - KEPT + 1 > 0:
                self._files.forget_before(batch_id - KEPT + 1)


def task_batch_id() -> int | None:
    """The micro-batch a Spark task of a streaming query belongs to (Spark's local property
    ``streaming.sql.batchId``), or None outside one."""
    from pyspark import TaskContext

    context: Any = TaskContext.get()
    text = context.getLocalProperty("streaming.sql.batchId") if context is not None else None
    return int(text) if text else None
