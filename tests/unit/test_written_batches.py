"""The record, beside a streaming query's checkpoint, of which stores each micro-batch wrote
(``federator_spark.sink.written_batches``); the streams that use it are tested over real Spark in
tests/spark (test_stream.py, test_source.py)."""

from __future__ import annotations

import threading

import pytest

from federator_spark.sink.errors import SinkError
from federator_spark.sink.written_batches import KEPT, WrittenBatches


def test_stores_recorded_at_once_from_threads_are_all_kept(tmp_path) -> None:
    written = WrittenBatches(str(tmp_path / "checkpoint"))
    assert written.of(0) == {}
    stores = [f"s{i}" for i in range(8)]
    threads = [threading.Thread(target=written.record, args=(3, s, f"t-{s}")) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # another reader (the format's tasks, a restarted query) sees the same
    assert WrittenBatches(f"file://{tmp_path}/checkpoint").of(3) == {s: f"t-{s}" for s in stores}
    assert written.of(2) == {} and written.of(4) == {}


def test_only_the_latest_micro_batches_are_kept(tmp_path) -> None:
    written = WrittenBatches(str(tmp_path))
    for batch in range(KEPT + 5):
        written.record(batch, "s", str(batch))
    assert written.of(0) == {} and written.of(4) == {}
    assert written.of(5) == {"s": "5"} and written.of(KEPT + 4) == {"s": str(KEPT + 4)}
    assert len(list((tmp_path / "federator-commits").iterdir())) == KEPT


def test_a_location_it_cannot_open_says_which_to_use() -> None:
    with pytest.raises(SinkError, match="use a local, S3, GCS or HDFS path"):
        WrittenBatches("nosuchfs://bucket/checkpoint")
