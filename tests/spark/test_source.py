"""spark.read.format("federator") over the world's stores on its two real nodes: each store
partition read by a Spark task from its owner, equal to the nodes' own SQL answer."""

from __future__ import annotations

import pytest

from tests.spark.conftest import rows, sql

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def read(spark, world):
    from spark.source import register

    register(spark)
    url = ",".join(f"http://{n.endpoint}" for n in world.cluster.nodes)

    def read_(**options):
        reader = spark.read.format("federator").option("url", url)
        for k, v in options.items():
            reader = reader.option(k, v)
        return reader.load()
    return read_


@pytest.mark.parametrize("store", ["rt_string", "rt_bytes", "rt_json", "rt_window", "rt_session"])
def test_a_store_reads_as_the_nodes_answer_it(world, read, store) -> None:
    df = read(store=store, consistency_token=world.tokens[store])
    expected = sql(world.node, f"SELECT * FROM {store}", world.tokens[store])
    assert df.columns == expected.column_names
    assert df.rdd.getNumPartitions() == 4  # one Spark partition per store partition
    assert rows(df.toArrow()) == rows(expected) and len(expected) > 0


def test_an_answer_reads_and_joins_with_the_jobs_own_data(spark, world, read) -> None:
    answer = read(sql="SELECT name, label FROM rt_string WHERE label IS NOT NULL", consistency_token=world.tokens["rt_string"])
    mine = spark.createDataFrame([(r[0], i) for i, r in enumerate(answer.collect())], "name string, mine int")
    joined = answer.join(mine, "name")
    assert joined.count() == answer.count() > 0
    assert rows(sql(world.node, "SELECT name, label FROM rt_string WHERE label IS NOT NULL", world.tokens["rt_string"])) == \
        rows(answer.toArrow())


def test_bad_options_say_what_to_pass(read) -> None:
    with pytest.raises(Exception, match="one of the two"):
        read().collect()
    with pytest.raises(Exception, match="unknown store"):
        read(store="no_such_store").collect()
