"""Structured Streaming over a folder of Parquet files, keeping stores equal to what the
batch job computes over every file seen so far.

A micro-batch holds only the rows of the new files, but the stores hold aggregates over all
rows. So each micro-batch recomputes the keys it touches over every row seen so far (the
earlier micro-batches' files, restricted to those keys, plus the new rows) and upserts them.
That is exactly the batch answer for those keys, and every other key is unchanged by the new
rows. Entries that the new rows make obsolete (a session merged into a longer one) are
deleted one by one: a replace-mode write would tombstone every key the micro-batch did not
touch.

Which files earlier micro-batches read is kept beside Spark's checkpoint
(``<checkpoint>/federator-files/<batch id>.json``), so a restarted stream recomputes over the
same files; a micro-batch that Spark runs again (after a crash) gets the same files and
computes the same answer. The stores it had already written then are not written again
(``MicroBatch.once``, ``federator_spark.sink.written_batches``).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, TypeVar
from urllib.parse import unquote

from federator.query.position import Position
from federator_spark.jobs.common import merged_token, step
from federator_spark.sink.checks import estimate
from federator_spark.sink.checkpoint_files import CheckpointFiles
from federator_spark.sink.tasks import session_conf
from federator_spark.sink.written_batches import WrittenBatches

MANIFESTS = "federator-files"
FILE_COLUMN = "_federator_file"
NEW_ROW = "_federator_new"  # MicroBatch.marked: the row is one of this micro-batch's
# A micro-batch touching at most this many values of a key reads the earlier files' rows
# with those values by a filter on the values (MicroBatch._earlier_rows)
TOUCHED_BY_VALUE = 10_000


@dataclass
class MicroBatch:
    """One micro-batch, as the per-store updates see it."""

    spark: Any
    batch_id: int
    schema: str  # DDL of the input rows
    new: Any  # this micro-batch's rows (the new files), cached
    files: list[str]  # the new files
    earlier_files: list[str]  # files of earlier micro-batches
    written: WrittenBatches | None = None  # the stores each micro-batch has written
    _history: dict[tuple[str, ...], Any] = field(default_factory=dict)  # keys -> marked rows
    _shared: dict[str, Any] = field(default_factory=dict)
    # the stores' updates run on threads of their own (in_parallel): one defines a frame they
    # share; reentrant, as a shared frame may be built from an earlier one
    _lock: threading.RLock = field(default_factory=threading.RLock)

    def once(self, store: str, write: Callable[[], tuple[str, str]]) -> tuple[str, str]:
        """``write()``'s (token, summary) for ``store``, recorded as written by this micro-batch;
        when an earlier run of this micro-batch (one Spark runs again after a stop) has written
        it, that write's token and no new write: the same files give the same answer."""
        done = self.written.of(self.batch_id).get(store) if self.written is not None else None
        if done is not None:
            return done, "written before this micro-batch was run again"
        token, summary = write()
        if self.written is not None:
            self.written.record(self.batch_id, store, token)
        return token, summary

    def marked(self, *keys: str) -> Any:
        """Every row seen so far (earlier and new) whose ``keys`` columns match a row of this
        micro-batch, with NEW_ROW true for the micro-batch's own rows. Computed once for the
        micro-batch (every store that updates by the same keys shares it) and held in memory:
        the earlier files are read once, the stores' frames read memory, and Spark knows their
        size (so their writes fetch them from the driver in one job: spark/sink/small.py).
        Micro-batch 0 takes the same path, with no earlier rows: Spark has then planned and
        compiled the queries every later micro-batch runs."""
        from pyspark.sql import functions as F

        with self._lock:
            if keys not in self._history:
                new = self.new.withColumn(NEW_ROW, F.lit(True))
                df = self._earlier_rows(keys).withColumn(NEW_ROW, F.lit(False)).unionByName(new).cache()
                df.count()  # one job now, rather than one per thread that would wait on it
                self._history[keys] = df
            return self._history[keys]

    def _earlier_rows(self, keys: tuple[str, ...]) -> Any:
        """The earlier files' rows whose ``keys`` match a row of this micro-batch. Few values of
        one key filter the scan by value (no job to broadcast them: Spark filters each file's
        rows as it reads them); else by a semi-join on the distinct keys."""
        from pyspark.sql import functions as F

        if not self.earlier_files:
            return self.spark.createDataFrame([], self.schema)
        scan = self.spark.read.schema(self.schema).parquet(*self.earlier_files)
        if len(keys) == 1:
            values = [r[0] for r in self.new.select(*keys).distinct().limit(TOUCHED_BY_VALUE + 1).collect()]
            if len(values) <= TOUCHED_BY_VALUE:
                return scan.where(F.col(keys[0]).isin(values))  # a null key matches nothing, as in a join
        return scan.join(F.broadcast(self.new.select(*keys).distinct()), list(keys), "left_semi")

    def earlier(self, *keys: str) -> Any:
        """Rows of earlier micro-batches whose ``keys`` columns match a row of this one."""
        from pyspark.sql import functions as F

        return self.marked(*keys).where(~F.col(NEW_ROW)).drop(NEW_ROW)

    def so_far(self, *keys: str) -> Any:
        """Every row seen so far (earlier and new) whose ``keys`` match a row of this micro-batch."""
        return self.marked(*keys).drop(NEW_ROW)

    def everything(self) -> Any:
        """Every row seen so far, for a store that cannot be updated key by key."""
        if not self.earlier_files:
            return self.new
        return self.spark.read.schema(self.schema).parquet(*self.earlier_files).unionByName(self.new)

    def shared(self, name: str, build: Callable[[], Any]) -> Any:
        """``build()`` cached for the micro-batch under ``name``: stores that derive from the
        same frame (say, two stores of one aggregation) compute it once."""
        with self._lock:
            if name not in self._shared:
                self._shared[name] = build().cache()
            return self._shared[name]

    def release(self) -> None:
        for df in [*self._history.values(), *self._shared.values()]:
            df.unpersist()
        self._history.clear()
        self._shared.clear()


T = TypeVar("T")


def in_parallel(groups: Sequence[Sequence[tuple[str, Callable[[], T]]]], spark: Any = None) -> dict[str, T]:
    """name -> what its call returned: each group's calls in order, the groups at once, on
    threads of their own. A micro-batch's few rows make each store's update a chain of small
    Spark jobs, most of whose time is the driver's (planning, scheduling, the writes'
    round trips); side by side, one store's jobs run while another's are being planned.
    Returns when every call has ended; raises the first failure, by group order. With
    ``spark`` (the session) the threads take the caller's Spark local properties."""
    if len(groups) <= 1:
        return {name: call() for group in groups for name, call in group}
    with ThreadPoolExecutor(max_workers=len(groups), thread_name_prefix="store-update") as pool:
        futures = [pool.submit(_inheriting(lambda g=group: [(name, call()) for name, call in g], spark))
                   for group in groups]
    return {name: value for future in futures for name, value in future.result()}


def _inheriting(target: Callable[[], T], spark: Any) -> Callable[[], T]:
    """``target`` run with the calling thread's Spark local properties (its job group and tags
    among them), as Spark's own threads would inherit them: stopping the stream cancels the
    stream's jobs by those, the ones started from these threads included."""
    if spark is None:
        return target
    from pyspark.util import inheritable_thread_target

    return inheritable_thread_target(spark)(target)


# Spark settings while a micro-batch is written. Adaptive execution runs each shuffle stage
# as a Spark job of its own, to re-plan from what it measured: a micro-batch of a few
# thousand rows has nothing to re-plan for, and its ~30 jobs became ~12 without it.
MICRO_BATCH_CONF = {"spark.sql.adaptive.enabled": "false"}
SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"


# The stream's driver JVM compiles with C1 only (the quick JIT). With the default tiered JIT,
# C2 compiling the micro-batches' code competed with them for a small machine's cores: on
# local[2] the first micro-batches after micro-batch 0 were the slowest
# (tests/bench/test_bench_stream.py measures it). The price: a large micro-batch runs slower.
JAVA_OPTIONS = ("-XX:TieredStopAtLevel=1",)


def micro_batch_conf(spark: Any) -> dict[str, str]:
    """MICRO_BATCH_CONF, and no more shuffle partitions than Spark has cores for tasks (never
    more than the session's own setting). Each shuffle partition is a task, and with adaptive
    execution off nothing merges the small ones: a micro-batch's few rows in 8 partitions on
    local[2] paid for 4x the tasks, and each task costs a warm micro-batch time
    (tests/bench/test_bench_stream.py measures it)."""
    configured = int(spark.conf.get(SHUFFLE_PARTITIONS, "200"))
    cores = max(1, int(spark.sparkContext.defaultParallelism))
    return {**MICRO_BATCH_CONF, SHUFFLE_PARTITIONS: str(min(configured, cores))}


def rows_in(df: Any) -> int:
    """``df``'s rows, for a summary: a cached DataFrame that a write has read knows its count
    (Spark's statistics of the cache, no job); any other is counted."""
    if df.is_cached:
        # a new plan over the cache: a DataFrame's own plan keeps the statistics it first
        # computed, which may predate the cache's being read
        rows, _ = estimate(df.select("*"))
        if rows is not None:
            return rows
    return df.count()


# An update writes its stores from one micro-batch: store -> (consistency token, summary).
Update = Callable[[MicroBatch], Mapping[str, tuple[str, str]]]


def _local(path: str) -> str | None:
    """The local file a (decoded) path names, or None for another file system."""
    if path.startswith("file:"):
        return "/" + path[len("file:"):].lstrip("/")
    return path if "://" not in path else None


class _Manifests:
    """The files each micro-batch read, one small JSON file per batch id."""

    def __init__(self, checkpoint: str) -> None:
        self._files = CheckpointFiles(checkpoint, MANIFESTS)

    def record(self, batch_id: int, files: list[str]) -> None:
        self._files.write(batch_id, sorted(files))

    def before(self, batch_id: int) -> list[str]:
        """Files of micro-batches before ``batch_id``; ones from later ids (a run that Spark
        rolled back) do not count."""
        out: set[str] = set()
        for b in self._files.batch_ids():
            if b < batch_id:
                out.update(self._files.read(b) or ())
        return sorted(out)


@dataclass
class _Tracker:
    """What the driver loop needs to know of the micro-batches done so far."""

    batches: int = 0
    running: bool = False  # a micro-batch is being written
    last_batch_id: int = -1
    tokens: dict[str, str] = field(default_factory=dict)  # store -> token covering every write of this run


def _merge(tokens: dict[str, str], store: str, token: str) -> None:
    pos = Position.from_token(token)
    tokens[store] = (Position.from_token(tokens[store]).merge(pos) if store in tokens else pos).to_token()


def start(spark: Any, input_path: str, checkpoint: str, schema: str, update: Update, *,
          trigger_seconds: float = 5.0, until_idle: bool = False,
          progress: Callable[[str], None] = step) -> tuple[Any, _Tracker]:
    """Start the stream over ``input_path``; returns the StreamingQuery and its tracker."""
    from pyspark.sql import functions as F

    Path(input_path).mkdir(parents=True, exist_ok=True)  # a stream may start before the first file
    manifests = _Manifests(str(checkpoint))
    written = WrittenBatches(str(checkpoint))
    tracker = _Tracker()

    def run_batch(batch_df: Any, batch_id: int) -> None:
        started = time.monotonic()
        tracker.running = True
        batch_df = batch_df.cache()
        try:
            # the stream's DataFrames belong to a clone of the session; the stores' reads of
            # earlier files, to the session itself
            conf = micro_batch_conf(spark)
            with session_conf(spark, conf, overriding=(SHUFFLE_PARTITIONS,)), \
                    session_conf(batch_df.sparkSession, conf, overriding=(SHUFFLE_PARTITIONS,)):
                write_batch(batch_df, batch_id, started)
        finally:
            batch_df.unpersist()
            tracker.running = False

    def write_batch(batch_df: Any, batch_id: int, started: float) -> None:
        per_file = dict(batch_df.groupBy(FILE_COLUMN).count().collect())  # one job: the files and rows
        # _metadata.file_path is a URI (a space is %20); reading it back wants the plain path
        files, rows = sorted(unquote(f) for f in per_file), sum(per_file.values())
        earlier = sorted(set(manifests.before(batch_id)) - set(files))
        gone = [f for f in earlier if (p := _local(f)) is not None and not os.path.exists(p)]
        if gone:
            raise RuntimeError(
                f"{len(gone)} input file(s) that earlier micro-batches read are gone (e.g. {gone[0]}); "
                "files in a streamed folder must stay: restart with a new checkpoint folder")
        manifests.record(batch_id, files)
        mb = MicroBatch(spark, batch_id, schema, batch_df.drop(FILE_COLUMN), files, earlier, written)
        summaries = []
        if rows:
            try:
                for store, (token, summary) in update(mb).items():
                    _merge(tracker.tokens, store, token)
                    summaries.append(f"{store}: {summary}")
            finally:
                mb.release()
        tracker.batches += 1
        tracker.last_batch_id = batch_id
        progress(f"batch {batch_id}: {rows:,} new rows from {len(files)} file(s)"
                 + (f"; {', '.join(summaries)}" if summaries else "")
                 + f" ({time.monotonic() - started:.1f}s); consistency token {merged_token(tracker.tokens)}")

    stream = (spark.readStream.schema(schema).parquet(str(input_path))
              .select("*", F.col("_metadata.file_path").alias(FILE_COLUMN)))
    writer = stream.writeStream.foreachBatch(run_batch).option("checkpointLocation", str(checkpoint))
    writer = writer.trigger(availableNow=True) if until_idle else writer.trigger(
        processingTime=f"{trigger_seconds} seconds")
    return writer.start(), tracker


def run(spark: Any, input_path: str, checkpoint: str, schema: str, update: Update, *,
        trigger_seconds: float = 5.0, max_batches: int | None = None, until_idle: bool = False,
        progress: Callable[[str], None] = step) -> dict[str, str]:
    """Run the stream until it is idle (``until_idle``), ``max_batches`` micro-batches are done,
    or Ctrl-C; returns store -> consistency token covering every write of the run."""
    progress(f"streaming {input_path} (checkpoint {checkpoint}; "
             + ("until every file there now is read)" if until_idle else f"a micro-batch every {trigger_seconds:g}s)"))
    query, tracker = start(spark, input_path, checkpoint, schema, update, trigger_seconds=trigger_seconds,
                           until_idle=until_idle, progress=progress)
    # Ctrl-C lets the running micro-batch finish (a second one stops at once). Stopping a query
    # mid-batch is safe (Spark redoes the batch on restart) but noisy: PySpark's own handler
    # breaks the py4j call in progress, and with Spark 4.0 the stream thread was seen dying of
    # a StackOverflowError (in a regex) on the way out.
    hits: list[int] = []
    previous = (signal.signal(signal.SIGINT, lambda *_: hits.append(1))
                if threading.current_thread() is threading.main_thread() else None)

    def between_batches() -> bool:  # lastProgress comes after the commit: a restart won't redo it
        last = query.lastProgress
        return not tracker.running and (tracker.last_batch_id < 0 or bool(last)
                                         and last["batchId"] >= tracker.last_batch_id)

    try:
        said = False
        while not query.awaitTermination(0.5):
            if hits and not said:
                progress("interrupted: stopping" + (" after this micro-batch (Ctrl-C again: now)"
                                                    if tracker.running else ""))
                said = True
            if len(hits) > 1 or (hits and between_batches()):
                break
            if max_batches and tracker.batches >= max_batches and between_batches():
                progress(f"{tracker.batches} micro-batch(es) done: stopping")
                break
    finally:
        if query.isActive:
            query.stop()
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    return tracker.tokens
