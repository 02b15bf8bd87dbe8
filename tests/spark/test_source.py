"""spark.read.format("federator") over the world's stores on its two real nodes: each store
partition read by a Spark task from its owner, equal to the nodes' own SQL answer."""

from __future__ import annotations

import pytest

from tests.spark.conftest import changelog_records, rows, sql

pytestmark = [pytest.mark.integration, pytest.mark.apache_kafka]


@pytest.fixture(scope="module")
def read(spark, world):
    from federator_spark.source import register

    register(spark)
    url = ",".join(f"http://{n.endpoint}" for n in world.cluster.nodes)

    def read_(**options):
        reader = spark.read.format("federator").option("url", url)
        for k, v in options.items():
            reader = reader.option(k, v)
        return reader.load()
    return read_


@pytest.mark.apache_kafka(long=True)  # reads ask the nodes over HTTP: the broker is not in the way
@pytest.mark.parametrize("store", ["rt_string", "rt_bytes", "rt_json", "rt_window", "rt_session"])
def test_a_store_reads_as_the_nodes_answer_it(world, read, store) -> None:
    df = read(store=store, consistency_token=world.tokens[store])
    expected = sql(world.node, f"SELECT * FROM {store}", world.tokens[store])
    assert df.columns == expected.column_names
    assert df.rdd.getNumPartitions() == 4  # one Spark partition per store partition
    assert rows(df.toArrow()) == rows(expected) and len(expected) > 0


@pytest.mark.apache_kafka(long=True)  # reads ask the nodes over HTTP: the broker is not in the way
def test_an_answer_reads_and_joins_with_the_jobs_own_data(spark, world, read) -> None:
    answer = read(sql="SELECT name, label FROM rt_string WHERE label IS NOT NULL", consistency_token=world.tokens["rt_string"])
    mine = spark.createDataFrame([(r[0], i) for i, r in enumerate(answer.collect())], "name string, mine int")
    joined = answer.join(mine, "name")
    assert joined.count() == answer.count() > 0
    assert rows(sql(world.node, "SELECT name, label FROM rt_string WHERE label IS NOT NULL", world.tokens["rt_string"])) == \
        rows(answer.toArrow())


@pytest.mark.apache_kafka(long=True)  # reads ask the nodes over HTTP: the broker is not in the way
@pytest.mark.parametrize("store, spark_filter, where, partitions", [
    # the key: only the partition holding it is read (a key lookup on its owner)
    ("rt_json", "player = 'p3'", "player = 'p3'", 1),
    ("rt_json", "player IN ('p1', 'p4', 'nobody')", "player IN ('p1', 'p4', 'nobody')", None),
    # other columns: every partition, each owner filtering before its rows leave it
    ("rt_json", "score > 0 AND team IS NOT NULL", "score > 0 AND team IS NOT NULL", 4),
    ("rt_json", "NOT active OR ratio < 0", "NOT active OR ratio < 0", 4),
    ("rt_json", "team LIKE 'r%' AND level <= 3", "team LIKE 'r%' AND level <= 3", 4),
    ("rt_window", "player = 'bob' AND points >= 12", "player = 'bob' AND points >= 12", 1),
    ("rt_session", "games BETWEEN 2 AND 4", "games BETWEEN 2 AND 4", 4),
])
def test_spark_filters_go_to_the_owners_and_the_rows_are_the_nodes_answer(world, read, store, spark_filter, where,
                                                                           partitions) -> None:
    df = read(store=store, consistency_token=world.tokens[store]).filter(spark_filter)
    expected = sql(world.node, f"SELECT * FROM {store} WHERE {where}", world.tokens[store])
    assert rows(df.toArrow()) == rows(expected)
    if partitions is not None:  # key filters read fewer partitions; the others all of them
        assert df.rdd.getNumPartitions() == partitions


def test_the_reader_keeps_the_filters_it_can_apply_and_gives_back_the_rest() -> None:
    import pyarrow as pa
    from pyspark.sql import datasource as ds

    from federator_spark.source import FederatorReader, _Options

    reader = object.__new__(FederatorReader)  # its filters alone, without a Spark schema or a node
    reader.opts = _Options({"url": "http://unused:1", "store": "s"})
    reader.arrow_schema = pa.schema([("k", pa.string()), ("n", pa.int64()), ("seen", pa.timestamp("us", "UTC")),
                                     ("tags", pa.list_(pa.string()))])
    reader.where = []
    kept = [ds.EqualTo(("k",), "a"), ds.In(("N",), (1, 2)), ds.Not(ds.IsNull(("n",))), ds.StringStartsWith(("k",), "x")]
    given_back = [ds.GreaterThan(("seen",), 0), ds.EqualTo(("tags",), "a"), ds.EqualTo(("k", "inner"), 1),
                  ds.EqualTo(("unknown",), 1)]
    assert list(reader.pushFilters(kept + given_back)) == given_back
    assert reader.where == ['"k" = \'a\'', '"n" IN (1, 2)', 'NOT ("n" IS NULL)', 'STARTS_WITH("k", \'x\')']


@pytest.mark.apache_kafka(long=True)  # reads ask the nodes over HTTP: the broker is not in the way
def test_bad_options_say_what_to_pass(read) -> None:
    with pytest.raises(Exception, match="one of the two"):
        read().collect()
    with pytest.raises(Exception, match="unknown store"):
        read(store="no_such_store").collect()


def test_a_format_write_is_what_the_nodes_answer(spark, world) -> None:
    from federator_spark.source import last_write_token, register

    register(spark)
    name = "fmt_players"
    df = spark.createDataFrame([("a", "red", 3, 1.5), ("b", None, 7, -2.0), ("c", "blue", None, 0.25)],
                               "player string, team string, games long, ratio double")
    (df.write.format("federator").mode("append").option("store", name).option("key", "player")
     .option("value", "team,games,ratio").option("partitions", "4").option("bootstrap_servers", world.bootstrap)
     .option("application_id", world.app).save())
    token = last_write_token(world.app, name)
    answer = sql(world.node, f"SELECT player, team, games, ratio FROM {name}", token)
    assert rows(answer) == sorted([("a", "red", 3, 1.5), ("b", None, 7, -2.0), ("c", "blue", None, 0.25)])

    # overwrite replaces: a key the new DataFrame lacks is deleted, the others updated
    df2 = spark.createDataFrame([("a", "green", 4, 1.0), ("d", "red", 1, 2.0)], df.schema)
    (df2.write.format("federator").mode("overwrite").option("store", name).option("key", "player")
     .option("value", "team,games,ratio").option("partitions", "4").option("bootstrap_servers", world.bootstrap)
     .option("application_id", world.app).save())
    answer = sql(world.node, f"SELECT player, team, games, ratio FROM {name}", last_write_token(world.app, name))
    assert rows(answer) == [("a", "green", 4, 1.0), ("d", "red", 1, 2.0)]


def test_a_format_write_of_windows_and_a_bad_row(spark, world) -> None:
    from federator_spark.source import last_write_token, register
    from tests.spark.conftest import T0

    register(spark)
    name = "fmt_windows"
    data = [("ann", T0, 5), ("ann", T0 + 60_000, 6), ("bob", T0, 7)]
    df = spark.createDataFrame(data, "player string, start long, points long")

    def write(frame):
        (frame.write.format("federator").mode("append").option("store", name).option("key", "player")
         .option("value", "points").option("type", "window").option("window_start", "start")
         .option("window_size_ms", "60000").option("partitions", "4").option("bootstrap_servers", world.bootstrap)
         .option("application_id", world.app).save())

    write(df)
    answer = sql(world.node, f"SELECT player, window_start, points FROM {name}", last_write_token(world.app, name))
    assert rows(answer) == sorted(data)
    bad = spark.createDataFrame([(None, T0, 1)], df.schema)
    with pytest.raises(Exception, match="key column 'player' has 1 null values"):
        write(bad)


def test_a_streaming_query_upserts_each_micro_batch(spark, world, tmp_path) -> None:
    """writeStream.format("federator") over a folder of Parquet files (append mode, the only one
    Spark gives Python data sources): each micro-batch's rows upserted, once; the token file
    follows."""
    from federator_spark.source import last_write_token, register

    register(spark)
    name, folder = "fmt_stream", tmp_path / "in"
    folder.mkdir()
    schema = "player string, points long"

    def add(batch: int, data: list[tuple]) -> None:
        spark.createDataFrame(data, schema).coalesce(1).write.parquet(str(folder / f"b{batch}"))

    def run() -> None:
        query = (spark.readStream.schema(schema).parquet(str(folder / "*")).writeStream.format("federator")
                 .outputMode("append").trigger(availableNow=True)
                 .option("checkpointLocation", str(tmp_path / "checkpoint")).option("store", name)
                 .option("key", "player").option("value", "points").option("partitions", "4")
                 .option("bootstrap_servers", world.bootstrap).option("application_id", world.app).start())
        query.awaitTermination(180)
        assert query.exception() is None, query.exception()

    add(0, [("ann", 5), ("bob", 2)])
    run()
    token = last_write_token(world.app, name)
    assert rows(sql(world.node, f"SELECT player, points FROM {name}", token)) == [("ann", 5), ("bob", 2)]
    add(1, [("bob", 10), ("cy", 1)])
    run()  # the same checkpoint: only the new file's micro-batch; ann untouched, bob's value replaced
    later = last_write_token(world.app, name)
    assert later != token
    assert rows(sql(world.node, f"SELECT player, points FROM {name}", later)) == [("ann", 5), ("bob", 10), ("cy", 1)]

    # stopped after the store's write of micro-batch 1 but before Spark recorded it done: the
    # restarted query runs micro-batch 1 again, and its rows are not produced a second time
    records = changelog_records(world.bootstrap, world.app, name)
    assert records == 4
    undone = lambda: [f.unlink() for f in (tmp_path / "checkpoint" / "commits").glob("*1*")]  # noqa: E731 - 1, .1.crc
    undone()
    run()
    assert changelog_records(world.bootstrap, world.app, name) == records
    assert last_write_token(world.app, name) == later
    # without the record beside the checkpoint, it would be: micro-batch 1 run again writes its rows
    undone()
    (tmp_path / "checkpoint" / "federator-commits" / "1.json").unlink()
    run()
    assert changelog_records(world.bootstrap, world.app, name) == records + 2
    assert rows(sql(world.node, f"SELECT player, points FROM {name}", last_write_token(world.app, name))) == \
        [("ann", 5), ("bob", 10), ("cy", 1)]
