"""word_counts: text files -> the kv store ``word_counts`` (word -> count).

Words are runs of letters (any alphabet), lower-cased. With no --input, a small built-in
text is counted.

    python -m federator_spark.jobs.word_counts --bootstrap-servers HOST:PORT --application-id APP [--input PATH]
"""

from __future__ import annotations

import sys
from typing import Any

from federator_spark.jobs.common import parse, parser, run_job, step
from federator_spark.sink import write_store

STORE = "word_counts"
TEXT = """\
Federator serves SQL over the live state of a data pipeline. A pipeline keeps its results
in partitioned key value stores, one Kafka changelog topic per store and one RocksDB shard
per partition. Federator reads that state live, without copying it into a database: any
node takes SQL, plans it into per partition key and range queries, sends each query to the
node that owns the partition, and merges the Arrow results into one answer.
"""


def count_words(spark: Any, input_path: str | None = None) -> Any:
    """DataFrame(word string, count long), one row per word."""
    from pyspark.sql import functions as F

    if input_path:
        lines = spark.read.text(input_path)
    else:
        lines = spark.createDataFrame([(line,) for line in TEXT.splitlines()], "value string")
    words = lines.select(F.explode(F.split(F.lower(F.col("value")), r"[^\p{L}]+")).alias("word"))
    return words.where(F.length("word") > 0).groupBy("word").agg(F.count(F.lit(1)).alias("count"))


def run(spark: Any, bootstrap: str, app: str, input_path: str | None = None, partitions: int = 8,
        mode: str = "replace") -> dict[str, str]:
    """Count and write; store -> consistency token. ``replace``: words gone from the input go
    from the store too."""
    step(f"counting words in {input_path or 'the built-in text'}")
    counts = count_words(spark, input_path)
    token = write_store(counts, STORE, key="word", value="count", partitions=partitions,
                        bootstrap_servers=bootstrap, application_id=app, mode=mode, progress=step)
    return {STORE: token}


def main(argv: list[str] | None = None) -> int:
    p = parser("word_counts", "Count the words of text files into the kv store word_counts.")
    p.add_argument("--input", help="text file(s) or folder; default: a small built-in text")
    args = parse(p, argv)
    return run_job(args.master, "word_counts",
                   lambda spark: run(spark, args.bootstrap_servers, args.application_id, args.input, args.partitions))


if __name__ == "__main__":
    sys.exit(main())
