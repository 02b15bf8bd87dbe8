"""Submitted by tests/spark/test_cluster.py with spark-submit to a standalone cluster: prints
where the executors imported federator from, then runs the word_counts job."""

import sys

from pyspark.sql import SparkSession


def where_federator(_: object) -> str:
    import federator

    return federator.__file__


spark = SparkSession.builder.getOrCreate()
paths = spark.sparkContext.parallelize(range(2), 2).map(where_federator).collect()
print("executors imported federator from:", sorted(set(paths)), flush=True)

from federator_spark.jobs import word_counts  # noqa: E402 - on the driver, from the shipped zip too

sys.exit(word_counts.main(sys.argv[1:]))
