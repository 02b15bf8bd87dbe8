"""Bad input fails before anything is written, naming the column and saying what to do."""

from __future__ import annotations

import uuid

import pytest

from federator import kafka
from federator.catalog import Catalog, changelog_topic
from federator_spark.sink import checks
from federator_spark.sink import SinkError, write_store
from tests.integration.changelog_util import read_partition
from tests.registry import REGISTRY

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def target(broker):
    app = f"se{uuid.uuid4().hex[:8]}"
    return broker, app


def attempt(target, df, store, **kw):
    broker, app = target
    with pytest.raises(SinkError) as e:
        write_store(df, store, bootstrap_servers=broker.bootstrap_servers, application_id=app, **kw)
    return str(e.value)


def nothing_written(target, store):
    broker, app = target
    assert Catalog(broker.bootstrap_servers, app, REGISTRY).get(store) is None
    assert kafka.topic_partitions(kafka.admin(broker.bootstrap_servers), changelog_topic(app, store)) is None


@pytest.fixture(scope="module")
def df(spark):
    return spark.createDataFrame(
        [("a", 1, 1.5, "x", 10, 20), ("b", 2, float("nan"), None, 30, 25), (None, 3, 0.0, "z", 40, 50)],
        "name string, n long, d double, s string, t0 long, t1 long",
    )


def test_null_keys_are_counted(target, df):
    msg = attempt(target, df, "nulls", key="name", value="n")
    assert "key column 'name' has 1 null values" in msg and "nothing was written" in msg
    nothing_written(target, "nulls")


def test_null_values_would_delete(target, df):
    msg = attempt(target, df.where("name IS NOT NULL"), "nullvals", key="name", value="s")
    assert "value column 's' has 1 null values" in msg and "fillna" in msg
    nothing_written(target, "nullvals")


def test_nan_in_a_json_record(target, df):
    msg = attempt(target, df.where("name IS NOT NULL"), "nan", key="name", value=["n", "d"])
    assert "value column 'd' has 1 NaN" in msg
    nothing_written(target, "nan")


def test_duplicate_keys(target, spark):
    dup = spark.createDataFrame([("a", 1), ("a", 2), ("b", 3)], "k string, v long")
    msg = attempt(target, dup, "dups", key="k", value="v")
    assert "('k') is not unique" in msg and "'a' x2" in msg and "aggregate" in msg
    nothing_written(target, "dups")


@pytest.mark.parametrize("on_driver", [True, False], ids=["hashes-sorted-on-driver", "hashes-grouped-by-spark"])
def test_duplicate_keys_far_apart(target, spark, monkeypatch, on_driver):
    """Rows 0 and 29,999 share a key: other Spark partitions, other Arrow batches. Both ways of
    comparing key hashes find it, and the exact check names it, before anything is written."""
    from pyspark.sql import functions as F

    if not on_driver:
        monkeypatch.setattr(checks, "DRIVER_HASH_ROWS", 0)
    dup = spark.range(30_000).select(F.format_string("k%d", F.col("id") % 29_999).alias("k"),
                                     F.col("id").alias("v")).repartition(3)
    msg = attempt(target, dup, "dups_far", key="k", value="v")
    assert "('k') is not unique (1 keys appear more than once: 'k0' x2)" in msg and "nothing was written" in msg
    nothing_written(target, "dups_far")


@pytest.mark.parametrize("on_driver", [True, False], ids=["hashes-sorted-on-driver", "hashes-grouped-by-spark"])
def test_duplicate_windows(target, spark, monkeypatch, on_driver):
    """A window store's key is the key and the window start: the same key in two windows is fine,
    twice in one window is not."""
    if not on_driver:
        monkeypatch.setattr(checks, "DRIVER_HASH_ROWS", 0)
    dup = spark.createDataFrame([("a", 0, 1), ("a", 60_000, 2), ("b", 0, 3), ("b", 0, 4)],
                                "k string, ws long, v long")
    msg = attempt(target, dup, "dups_win", key="k", value="v", type="window", window_start="ws",
                  window_size_ms=60_000)
    assert "key and window start ('k', 'ws') is not unique (1 keys appear more than once: ('b', 0) x2)" in msg
    nothing_written(target, "dups_win")


def test_failures_are_counted_in_every_batch(target, spark):
    """Counting goes on after the first failing batch (25 null keys over 25,000 rows)."""
    from pyspark.sql import functions as F

    df = spark.range(25_000).select(
        F.when(F.col("id") % 1000 == 0, F.lit(None)).otherwise(F.col("id").cast("string")).alias("k"),
        F.col("id").alias("v"))
    msg = attempt(target, df, "counted", key="k", value="v")
    assert "key column 'k' has 25 null values" in msg
    nothing_written(target, "counted")


@pytest.mark.parametrize("kw, expected", [
    (dict(key="nope", value="n"), "column 'nope' (the key) is not in the DataFrame"),
    (dict(key="NAME", value="n"), "did you mean 'name'?"),
    (dict(key="name", value="missing"), "column 'missing' (the value) is not in the DataFrame"),
    (dict(key="name", value=["n", "gone"]), "column 'gone' (a value field) is not in the DataFrame"),
    (dict(key="name", value="n", type="window", window_start="t0"), "a window store needs window_size_ms"),
    (dict(key="name", value="n", type="window", window_size_ms=60_000), "a window store needs window_start"),
    (dict(key="name", value="n", type="window", window_start="s", window_size_ms=1000),
     "column 's' (the window start) has Spark type string"),
    (dict(key="name", value="n", type="session", session_start="t0"), "a session store needs session_end"),
    (dict(key="name", value="n", window_start="t0"), "window_start is only for window stores"),
    (dict(key="name", value="n", type="hopping"), "type='hopping'"),
    (dict(key="name", value="n", mode="merge"), "mode='merge'"),
    (dict(key="name", value="n", partitions=0), "partitions=0"),
])
def test_arguments_and_columns(target, df, kw, expected):
    msg = attempt(target, df, "args", **kw)
    assert expected in msg, msg
    nothing_written(target, "args")


def test_types_that_fit_no_format(target, spark):
    odd = spark.createDataFrame([(True, 1.5, [1], 2)], "flag boolean, f float, arr array<int>, small short")
    assert "key column 'flag' has Spark type boolean" in attempt(target, odd, "types", key="flag", value="small")
    msg = attempt(target, odd.withColumn("k", odd.small.cast("string")), "types", key="k", value="f")
    assert "value column 'f' has Spark type float" in msg and "cast('double')" in msg
    msg = attempt(target, odd.withColumn("k", odd.small.cast("string")), "types", key="k", value="small")
    assert "value column 'small' has Spark type smallint" in msg and "cast('int')" in msg
    msg = attempt(target, odd.withColumn("k", odd.small.cast("string")), "types", key="k", value=["f", "arr"])
    assert "value column 'f' has Spark type float, which no JSON field type fits" in msg
    nothing_written(target, "types")


def test_reserved_column_names(target, spark):
    bad = spark.createDataFrame([("a", 1)], "k string, rowtime long")
    msg = attempt(target, bad, "reserved", key="k", value="rowtime")
    assert "'rowtime' is reserved" in msg and "withColumnRenamed" in msg
    nothing_written(target, "reserved")


def test_sessions_that_end_before_they_start(target, df):
    msg = attempt(target, df.where("name IS NOT NULL"), "sess", key="name", value="n", type="session",
                  session_start="t1", session_end="t0")
    assert "1 sessions end ('t0') before they start ('t1')" in msg
    nothing_written(target, "sess")


def test_an_existing_store_must_match(target, spark):
    broker, app = target
    ok = spark.createDataFrame([("a", 1), ("b", 2)], "k string, v long")
    token = write_store(ok, "fixed", key="k", value="v", partitions=3, bootstrap_servers=broker.bootstrap_servers,
                        application_id=app)
    assert token
    topic = changelog_topic(app, "fixed")
    before = sum(len(read_partition(broker, topic, p)) for p in range(3))
    msg = attempt(target, ok, "fixed", key="k", value="v", partitions=8)
    assert "store 'fixed' exists with 3 partitions, not 8; pass partitions=3" in msg
    msg = attempt(target, ok.selectExpr("k", "cast(v AS int) AS v"), "fixed", key="k", value="v", partitions=3)
    assert "value.format: 'long' vs 'int'" in msg
    msg = attempt(target, ok.withColumn("k", ok.k.cast("binary")), "fixed", key="k", value="v", partitions=3)
    assert "key.format: 'string' vs 'bytes'" in msg
    assert sum(len(read_partition(broker, topic, p)) for p in range(3)) == before == 2
