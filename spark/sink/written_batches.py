"""Which stores each micro-batch of a streaming query has written, kept beside its checkpoint.

Spark records a micro-batch as done (``<checkpoint>/commits/<batch id>``) only after the sink
has written it. A query stopped in between runs that micro-batch again on restart, over the
same input. Its stores already hold that answer, so writing it again would only put the same
records into their changelogs a second time. ``<checkpoint>/federator-commits/<batch id>.json``
(store -> the consistency token of its write) is written right after each store's write ends,
and a store named there is not written again by that micro-batch: each micro-batch's records
go into each changelog once. A write stopped before it ended is written again, whole: its
first records are then in the changelog twice (the same upserts, so the store ends the same).

The checkpoint may be on any file system ``pyarrow.fs`` opens (local, S3, GCS, HDFS with
libhdfs); Spark's tasks read it too (the format's stream writer), so it must be one they reach.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

FOLDER = "federator-commits"
KEPT = 100  # micro-batches whose records are kept; Spark runs again only its latest one


class WrittenBatches:
    """The stores each micro-batch of the query checkpointed at ``checkpoint`` has written."""

    def __init__(self, checkpoint: str) -> None:
        from pyarrow import fs

        if "://" not in checkpoint and not checkpoint.startswith("file:"):
            checkpoint = os.path.abspath(checkpoint)
        self.location = checkpoint  # as every process that reads it must name it
        try:
            self._fs, root = fs.FileSystem.from_uri(checkpoint)
        except Exception as e:  # noqa: BLE001 - pyarrow raises several kinds for a file system it lacks
            from spark.sink.errors import SinkError

            raise SinkError(f"cannot open the checkpoint location {checkpoint!r} ({e}); a streaming write keeps "
                            "which micro-batches it wrote there: use a local, S3, GCS or HDFS path") from None
        self.folder = f"{root.rstrip('/')}/{FOLDER}"
        self._lock = threading.Lock()  # stores of one micro-batch record from threads of their own

    def of(self, batch_id: int) -> dict[str, str]:
        """store -> token of the stores micro-batch ``batch_id`` has written."""
        from pyarrow import fs

        try:
            with self._fs.open_input_stream(self._path(batch_id)) as f:
                return dict(json.loads(f.read()))
        except FileNotFoundError:
            return {}
        except OSError:
            if self._fs.get_file_info(self._path(batch_id)).type == fs.FileType.NotFound:
                return {}
            raise

    def record(self, batch_id: int, store: str, token: str) -> None:
        """``store``'s write of micro-batch ``batch_id`` has ended, at ``token``."""
        with self._lock:
            written = {**self.of(batch_id), store: token}
            self._fs.create_dir(self.folder, recursive=True)
            tmp = f"{self.folder}/.{batch_id}.{os.getpid()}.{threading.get_ident()}.tmp"
            with self._fs.open_output_stream(tmp) as f:
                f.write(json.dumps(written, sort_keys=True).encode())
            self._fs.move(tmp, self._path(batch_id))  # a rename where the file system has one
            self._forget_before(batch_id - KEPT + 1)

    def _forget_before(self, batch_id: int) -> None:
        from pyarrow import fs

        if batch_id <= 0:
            return
        for info in self._fs.get_file_info(fs.FileSelector(self.folder)):
            stem = info.base_name.removesuffix(".json")
            if stem.isdigit() and int(stem) < batch_id:
                self._fs.delete_file(info.path)

    def _path(self, batch_id: int) -> str:
        return f"{self.folder}/{batch_id}.json"


def task_batch_id() -> int | None:
    """The micro-batch a Spark task of a streaming query belongs to (Spark's local property
    ``streaming.sql.batchId``), or None outside one."""
    from pyspark import TaskContext

    context: Any = TaskContext.get()
    text = context.getLocalProperty("streaming.sql.batchId") if context is not None else None
    return int(text) if text else None
