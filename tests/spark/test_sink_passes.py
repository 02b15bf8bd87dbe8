"""The sink's two passes: pass 1 checks in Spark, pass 2 serializes and produces many Arrow
batches per task; rows that must be computed again are cached between the passes; a key-hash
match that is not a real duplicate does not stop a write."""

from __future__ import annotations

import uuid

import pytest

from federator.catalog import changelog_topic
from federator.partitioner import partition_for
from federator.query.position import Position
from spark.sink import checks, tasks
from spark.sink import SinkError, write_store
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


def test_many_batches_round_trip(broker, spark, app):
    from pyspark.sql import functions as F

    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "7")  # many Arrow batches per task
    try:
        _many_batches_round_trip(broker, spark, app)
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")


def _many_batches_round_trip(broker, spark, app):
    from pyspark.sql import functions as F

    df = spark.range(500).select(F.format_string("key-%d", F.col("id")).alias("k"), (F.col("id") * 3).alias("v"))
    token = write_store(df, "sliced", key="k", value="v", partitions=P, bootstrap_servers=broker.bootstrap_servers,
                        application_id=app)
    records = changelog(broker, app, "sliced")
    assert sorted((k.decode(), int.from_bytes(v, "big", signed=True)) for _, _, k, v, _ in records) == \
        sorted((f"key-{i}", i * 3) for i in range(500))
    assert all(p == partition_for(k, P) for p, _, k, _, _ in records)
    assert len({t for *_, t in records}) == 1  # kv: one record time, the write's
    last = {p: max(o for q, o, *_ in records if q == p) for p in {p for p, *_ in records}}
    assert Position.from_token(token).partitions(changelog_topic(app, "sliced")) == last
    # a duplicate in another batch is still found
    dup = df.union(spark.createDataFrame([("key-250", 0)], "k string, v long"))
    with pytest.raises(SinkError, match=r"'key-250' x2"):
        write_store(dup, "sliced", key="k", value="v", partitions=P, bootstrap_servers=broker.bootstrap_servers,
                    application_id=app)
    assert len(changelog(broker, app, "sliced")) == 500


def test_equal_hashes_of_distinct_keys_are_written(broker, spark, app, monkeypatch):
    """Every key hashes alike here: the exact check finds no duplicate, so the write goes on."""
    from pyspark.sql import functions as F

    monkeypatch.setattr(checks, "key_hash", lambda columns: F.lit(7).cast("long"))
    df = spark.createDataFrame([("a", 1), ("b", 2), ("c", 3)], "k string, v long")
    write_store(df, "collide", key="k", value="v", partitions=P, bootstrap_servers=broker.bootstrap_servers,
                application_id=app)
    assert sorted(k for _, _, k, _, _ in changelog(broker, app, "collide")) == [b"a", b"b", b"c"]
    with pytest.raises(SinkError, match=r"'a' x2"):  # and real duplicates still fail
        write_store(df.union(df.where("k = 'a'")), "collide", key="k", value="v", partitions=P,
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


def test_a_non_deterministic_frame_is_written(broker, spark, app):
    """Values drawn at random (a non-deterministic plan, so cached between the passes): one
    record per row."""
    from pyspark.sql import functions as F

    df = spark.range(2000).select(F.format_string("r%d", F.col("id")).alias("k"),
                                  (F.rand() * 1e9).cast("long").alias("v"))
    write_store(df, "drawn", key="k", value="v", partitions=P, bootstrap_servers=broker.bootstrap_servers,
                application_id=app)
    records = changelog(broker, app, "drawn")
    assert sorted(k for _, _, k, _, _ in records) == sorted(f"r{i}".encode() for i in range(2000))
