"""The sink's two passes: pass 1 checks in Spark, pass 2 serializes and produces many Arrow
batches per task; rows that must be computed again are cached between the passes; a key-hash
match that is not a real duplicate does not stop a write. A write of few rows is produced by
the driver (spark/sink/small.py): the writes here run both ways."""

from __future__ import annotations

import uuid

import pytest

from federator.catalog import changelog_topic
from federator.partitioner import partition_for
from federator.query.position import Position
from federator_spark.sink import checks, small, tasks, write
from federator_spark.sink import SinkError, write_store
from tests.integration.changelog_util import read_partition

pytestmark = pytest.mark.integration

P = 3


@pytest.fixture(scope="module")
def app() -> str:
    return f"sp{uuid.uuid4().hex[:8]}"


def changelog(broker, app: str, store: str) -> list[tuple[int, int, bytes, bytes, int]]:
    """(partition, offset, key, value, timestamp) of every record."""
    topic = changelog_topic(app, store)
    return [(p, o, k, v, t) for p in range(P) for o, k, v, t in read_partition(broker, topic, p)]


@pytest.fixture(params=["driver", "tasks"])
def path(request, monkeypatch) -> str:
    """Which way the writes of a test go: the driver (their few rows) or Spark's Python tasks."""
    if request.param == "tasks":
        monkeypatch.setattr(small, "SMALL_ROWS", 0)
    return request.param


def test_many_batches_round_trip(broker, spark, app, path):
    from pyspark.sql import functions as F

    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "7")  # many Arrow batches per task
    try:
        _many_batches_round_trip(broker, spark, app, path)
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")


def _many_batches_round_trip(broker, spark, app, path):
    from pyspark.sql import functions as F

    df = spark.range(500).select(F.format_string("key-%d", F.col("id")).alias("k"), (F.col("id") * 3).alias("v"))
    store = f"sliced_{path}"
    token = write_store(df, store, key="k", value="v", partitions=P, bootstrap_servers=broker.bootstrap_servers,
                        application_id=app)
    records = changelog(broker, app, store)
    assert sorted((k.decode(), int.from_bytes(v, "big", signed=True)) for _, _, k, v, _ in records) == \
        sorted((f"key-{i}", i * 3) for i in range(500))
    assert all(p == partition_for(k, P) for p, _, k, _, _ in records)
    assert len({t for *_, t in records}) == 1  # kv: one record time, the write's
    last = {p: max(o for q, o, *_ in records if q == p) for p in {p for p, *_ in records}}
    assert Position.from_token(token).partitions(changelog_topic(app, store)) == last
    # a duplicate in another batch is still found
    dup = df.union(spark.createDataFrame([("key-250", 0)], "k string, v long"))
    with pytest.raises(SinkError, match=r"'key-250' x2"):
        write_store(dup, store, key="k", value="v", partitions=P, bootstrap_servers=broker.bootstrap_servers,
                    application_id=app)
    assert len(changelog(broker, app, store)) == 500


def test_equal_hashes_of_distinct_keys_are_written(broker, spark, app, monkeypatch, path):
    """Every key hashes alike here: the exact check finds no duplicate, so the write goes on."""
    from pyspark.sql import functions as F

    monkeypatch.setattr(checks, "key_hash", lambda columns: F.lit(7).cast("long"))
    df = spark.createDataFrame([("a", 1), ("b", 2), ("c", 3)], "k string, v long")
    write_store(df, f"collide_{path}", key="k", value="v", partitions=P, bootstrap_servers=broker.bootstrap_servers,
                application_id=app)
    assert sorted(k for _, _, k, _, _ in changelog(broker, app, f"collide_{path}")) == [b"a", b"b", b"c"]
    with pytest.raises(SinkError, match=r"'a' x2"):  # and real duplicates still fail
        write_store(df.union(df.where("k = 'a'")), f"collide_{path}", key="k", value="v", partitions=P,
                    bootstrap_servers=broker.bootstrap_servers, application_id=app)


def test_costly_or_changing_rows_are_cached_between_the_passes(spark):
    """A shuffle or a non-deterministic expression: pass 2 reads the rows pass 1 checked."""
    from pyspark.sql import functions as F

    df = spark.range(100).select(F.format_string("k%d", F.col("id")).alias("k"), F.col("id").alias("v"))
    assert not checks.costly(df)
    assert checks.costly(df.groupBy("k").agg(F.sum("v").alias("v")))
    assert checks.costly(df.withColumn("v", (F.rand() * 10).cast("long")))


def test_rows_are_estimated_so_small_writes_sort_their_hashes_on_the_driver(spark):
    """Spark's plan statistics give an estimate (an upper bound here), which keeps writes below
    DRIVER_HASH_ROWS off the group-by path."""
    from pyspark.sql import functions as F

    assert checks.estimated_rows(spark.range(1000)) == 1000
    df = spark.range(1000).select(F.format_string("k%d", F.col("id")).alias("k"), F.col("id").alias("v"))
    estimate = checks.estimated_rows(df)
    assert isinstance(estimate, int) and 1000 <= estimate <= checks.DRIVER_HASH_ROWS


def test_pass_2_settings_are_set_for_the_write_only(spark):
    """The sink's Arrow settings hold inside the block, a value the session sets itself wins,
    and afterwards the session is as it was."""
    key = "spark.sql.execution.arrow.maxBytesPerBatch"
    assert spark.conf.get(key, None) is None
    with tasks.session_conf(spark, tasks.PASS2_ARROW_CONF):
        assert spark.conf.get(key) == tasks.PASS2_ARROW_CONF[key]
    assert spark.conf.get(key, None) is None
    spark.conf.set(key, "1000000")
    try:
        with tasks.session_conf(spark, tasks.PASS2_ARROW_CONF):
            assert spark.conf.get(key) == "1000000"
        assert spark.conf.get(key) == "1000000"
    finally:
        spark.conf.unset(key)


def test_a_non_deterministic_frame_is_written(broker, spark, app, path):
    """Values drawn at random (a non-deterministic plan, so cached between the passes): one
    record per row."""
    from pyspark.sql import functions as F

    df = spark.range(2000).select(F.format_string("r%d", F.col("id")).alias("k"),
                                  (F.rand() * 1e9).cast("long").alias("v"))
    write_store(df, f"drawn_{path}", key="k", value="v", partitions=P, bootstrap_servers=broker.bootstrap_servers,
                application_id=app)
    records = changelog(broker, app, f"drawn_{path}")
    assert sorted(k for _, _, k, _, _ in records) == sorted(f"r{i}".encode() for i in range(2000))


def test_a_frame_larger_than_spark_estimates_is_written_by_the_tasks(broker, spark, app, monkeypatch):
    """Spark's estimate may be off (here it says 100 rows): the driver fetches at most one row
    more than fits, and a frame with more rows goes the two-pass way, every row written."""
    from pyspark.sql import functions as F

    monkeypatch.setattr(small, "SMALL_ROWS", 200)
    monkeypatch.setattr(write, "estimate", lambda df: (100, 4000))
    df = spark.range(500).select(F.format_string("m%d", F.col("id")).alias("k"), F.col("id").alias("v"))
    assert small.fetch_small(df.select("k", "v", F.lit(1).alias("h")), (100, 4000)) is None
    assert small.fetch_small(df.limit(150).select("k", "v", F.lit(1).alias("h")), (100, 4000)).num_rows == 150
    write_store(df, "estimated", key="k", value="v", partitions=P, bootstrap_servers=broker.bootstrap_servers,
                application_id=app)
    assert sorted(k for _, _, k, _, _ in changelog(broker, app, "estimated")) == sorted(
        f"m{i}".encode() for i in range(500))


def test_replace_deletes_the_keys_the_frame_lacks(broker, spark, app, path):
    """Replace mode marks which earlier keys a write holds (a Broadcast to the tasks, held by the
    driver when it writes): the others get tombstones."""
    from pyspark.sql import functions as F

    def frame(n: int) -> object:
        return spark.range(n).select(F.format_string("r%d", F.col("id")).alias("k"), F.col("id").alias("v"))

    store = f"replaced_{path}"
    for n in (300, 200):
        write_store(frame(n), store, key="k", value="v", mode="replace", partitions=P,
                    bootstrap_servers=broker.bootstrap_servers, application_id=app)
    latest: dict[bytes, bytes | None] = {}
    for p, o, k, v, _ in sorted(changelog(broker, app, store), key=lambda r: (r[0], r[1])):
        latest[k] = v
    assert sorted(k for k, v in latest.items() if v is not None) == sorted(f"r{i}".encode() for i in range(200))
    assert sum(v is None for v in latest.values()) == 100
