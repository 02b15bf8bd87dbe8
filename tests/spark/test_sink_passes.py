"""The sink's two passes: records serialized and cached in slices by pass 1 are what pass 2
produces, and a key-hash match that is not a real duplicate does not stop a write."""

from __future__ import annotations

import uuid

import pytest

from federator.catalog import changelog_topic
from federator.partitioner import partition_for
from federator.query.position import Position
from spark import sink
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


def test_many_slices_round_trip(broker, spark, app, monkeypatch):
    from pyspark.sql import functions as F

    monkeypatch.setattr(sink, "MAX_SLICE_BYTES", 200)  # a handful of records per cached value
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
    # a duplicate in another slice is still found
    dup = df.union(spark.createDataFrame([("key-250", 0)], "k string, v long"))
    with pytest.raises(SinkError, match=r"'key-250' x2"):
        write_store(dup, "sliced", key="k", value="v", partitions=P, bootstrap_servers=broker.bootstrap_servers,
                    application_id=app)
    assert len(changelog(broker, app, "sliced")) == 500


def test_equal_hashes_of_distinct_keys_are_written(broker, spark, app, monkeypatch):
    """Every key hashes alike here: the exact check finds no duplicate, so the write goes on."""
    from pyspark.sql import functions as F

    monkeypatch.setattr(sink, "_key_hash", lambda columns: F.lit(7).cast("long"))
    df = spark.createDataFrame([("a", 1), ("b", 2), ("c", 3)], "k string, v long")
    write_store(df, "collide", key="k", value="v", partitions=P, bootstrap_servers=broker.bootstrap_servers,
                application_id=app)
    assert sorted(k for _, _, k, _, _ in changelog(broker, app, "collide")) == [b"a", b"b", b"c"]
    with pytest.raises(SinkError, match=r"'a' x2"):  # and real duplicates still fail
        write_store(df.union(df.where("k = 'a'")), "collide", key="k", value="v", partitions=P,
                    bootstrap_servers=broker.bootstrap_servers, application_id=app)
