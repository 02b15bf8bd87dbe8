"""What every job shares: its command line, its SparkSession and how it reports."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from federator.query.position import Position

REPO_ROOT = Path(__file__).resolve().parents[2]


def step(msg: str) -> None:
    print(f"[{dt.datetime.now():%H:%M:%S}] {msg}", flush=True)


def parser(prog: str, description: str, require_app: bool = True) -> argparse.ArgumentParser:
    """The options every job takes; ``require_app=False`` leaves checking --application-id to
    the job (for modes that write no store)."""
    p = argparse.ArgumentParser(prog=f"python -m federator_spark.jobs.{prog}", description=description)
    p.add_argument("--bootstrap-servers", default=os.environ.get("FEDERATOR_BOOTSTRAP_SERVERS", "127.0.0.1:9092"),
                   help="Kafka bootstrap servers (default $FEDERATOR_BOOTSTRAP_SERVERS or 127.0.0.1:9092)")
    p.add_argument("--application-id", default=os.environ.get("FEDERATOR_APPLICATION_ID"),
                   required=require_app and not os.environ.get("FEDERATOR_APPLICATION_ID"),
                   help="the nodes' application id (default $FEDERATOR_APPLICATION_ID)")
    p.add_argument("--kafka-config", default=os.environ.get("FEDERATOR_KAFKA_CONFIG"), metavar="FILE",
                   help="the cluster's Kafka client properties, as `federator --kafka-config` takes them "
                        "(default $FEDERATOR_KAFKA_CONFIG)")
    p.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    p.add_argument("--partitions", type=int, default=8, help="partitions of stores the job creates (default 8)")
    return p


def parse(p: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """The job's arguments; its writes use --kafka-config's client properties."""
    from federator import kafka, kafka_properties

    args = p.parse_args(argv)
    if args.kafka_config:
        kafka.use_client_properties(args.bootstrap_servers, kafka_properties.load(args.kafka_config))
    return args


def spark_session(master: str = "local[*]", app_name: str = "federator-job", java_options: Sequence[str] = (),
                  **conf: Any) -> Any:
    """A SparkSession whose Python workers run this interpreter and can import this repository.
    ``java_options``: more options for the driver's JVM (taken only where this starts it, as
    for a local master; spark-submit starts it itself)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    path = os.environ.get("PYTHONPATH", "")
    if str(REPO_ROOT) not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), path) if p)
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master).appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "8")
        .config("spark.driver.extraJavaOptions", " ".join(["-Duser.timezone=UTC", *java_options]))
        .config("spark.executor.extraJavaOptions", "-Duser.timezone=UTC")
    )
    for k, v in conf.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def merged_token(tokens: Mapping[str, str]) -> str:
    """One token covering every store a job wrote."""
    pos = Position()
    for t in tokens.values():
        pos = pos.merge(Position.from_token(t))
    return pos.to_token()


def finish(tokens: Mapping[str, str]) -> None:
    for store, token in tokens.items():
        step(f"store {store}: consistency token {token}")
    # the last line: what a reader passes to /v1/sql as consistency_token
    print(f"consistency token: {merged_token(tokens)}", flush=True)


def run_job(master: str, app_name: str, job: Callable[[Any], Mapping[str, str] | None],
            java_options: Sequence[str] = ()) -> int:
    """A job's main: start Spark, run ``job(spark)``, stop Spark, print the tokens it returns."""
    step(f"starting Spark ({master})")
    spark = spark_session(master, app_name, java_options)
    try:
        tokens = job(spark)
    finally:
        spark.stop()
    if tokens is not None:
        finish(tokens)
    return 0
