"""One small JSON file per micro-batch in a folder beside a streaming query's Spark checkpoint
(``<checkpoint>/<folder>/<batch id>.json``), where the stream keeps what Spark's checkpoint does
not: which files a micro-batch read, which stores it wrote.

Through ``pyarrow.fs``, so the checkpoint may be on any file system it opens (local, S3, GCS,
HDFS with libhdfs); a file is written aside and moved into place, so a reader sees the old
one or the new one, never part of either (a rename where the file system has one).
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any


class CheckpointFiles:
    """The JSON files of ``folder`` beside the checkpoint at ``checkpoint``, one per batch id."""

    def __init__(self, checkpoint: str, folder: str) -> None:
        from pyarrow import fs

        if "://" not in checkpoint and not checkpoint.startswith("file:"):
            checkpoint = os.path.abspath(checkpoint)
        self.location = checkpoint  # as every process that reads it must name it
        try:
            self._fs, root = fs.FileSystem.from_uri(checkpoint)
        except Exception as e:  # noqa: BLE001 - pyarrow raises several kinds for a file system it lacks
            from federator_spark.sink.errors import SinkError

            raise SinkError(f"cannot open the checkpoint location {checkpoint!r} ({e}); a stream keeps what its "
                            "micro-batches read and wrote there: use a local, S3, GCS or HDFS path") from None
        self.folder = f"{root.rstrip('/')}/{folder}"

    def read(self, batch_id: int) -> Any:
        """What was written for ``batch_id``; None when nothing was."""
        from pyarrow import fs

        try:
            with self._fs.open_input_stream(self._path(batch_id)) as f:
                return json.loads(f.read())
        except FileNotFoundError:
            return None
        except OSError:  # some file systems say "not found" as a plain OSError
            if self._fs.get_file_info(self._path(batch_id)).type == fs.FileType.NotFound:
                return None
            raise

    def write(self, batch_id: int, value: Any) -> None:
        self._fs.create_dir(self.folder, recursive=True)
        tmp = f"{self.folder}/.{batch_id}.{os.getpid()}.{threading.get_ident()}.tmp"
        with self._fs.open_output_stream(tmp) as f:
            f.write(json.dumps(value, sort_keys=True).encode())
        self._fs.move(tmp, self._path(batch_id))

    def batch_ids(self) -> list[int]:
        """The batch ids written, in order."""
        from pyarrow import fs

        infos = self._fs.get_file_info(fs.FileSelector(self.folder, allow_not_found=True))
        return sorted(int(i.base_name[:-5]) for i in infos
                      if i.base_name.endswith(".json") and i.base_name[:-5].isdigit())

    def forget_before(self, batch_id: int) -> None:
        """Delete the files of the batch ids before ``batch_id``."""
        for b in self.batch_ids():
            if b < batch_id:
                self._fs.delete_file(self._path(b))

    def _path(self, batch_id: int) -> str:
        return f"{self.folder}/{batch_id}.json"
