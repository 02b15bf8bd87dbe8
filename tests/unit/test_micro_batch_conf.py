"""A micro-batch's Spark settings: adaptive execution off, and no more shuffle partitions than
cores (never more than the session's own setting); session_conf puts back what it changed."""

from __future__ import annotations

from types import SimpleNamespace

from federator_spark.jobs.streaming import SHUFFLE_PARTITIONS, micro_batch_conf
from federator_spark.sink.tasks import session_conf


class FakeConf:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = dict(values)

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.values.get(key, default)

    def set(self, key: str, value: str) -> None:
        self.values[key] = value

    def unset(self, key: str) -> None:
        self.values.pop(key, None)


def session(conf: dict[str, str], cores: int) -> SimpleNamespace:
    return SimpleNamespace(conf=FakeConf(conf), sparkContext=SimpleNamespace(defaultParallelism=cores))


def test_shuffle_partitions_come_down_to_the_cores_and_never_go_up():
    assert micro_batch_conf(session({SHUFFLE_PARTITIONS: "8"}, 2))[SHUFFLE_PARTITIONS] == "2"
    assert micro_batch_conf(session({SHUFFLE_PARTITIONS: "8"}, 64))[SHUFFLE_PARTITIONS] == "8"
    assert micro_batch_conf(session({}, 16))[SHUFFLE_PARTITIONS] == "16"  # Spark's default is 200
    assert micro_batch_conf(session({}, 2))["spark.sql.adaptive.enabled"] == "false"


def test_session_conf_overrides_only_what_it_is_told_to_and_puts_it_back():
    spark = session({SHUFFLE_PARTITIONS: "8", "spark.sql.adaptive.enabled": "true"}, 2)
    with session_conf(spark, {SHUFFLE_PARTITIONS: "2", "spark.sql.adaptive.enabled": "false", "x": "1"},
                      overriding=(SHUFFLE_PARTITIONS,)):
        # the session's own adaptive setting is the user's: left alone
        assert spark.conf.values == {SHUFFLE_PARTITIONS: "2", "spark.sql.adaptive.enabled": "true", "x": "1"}
    assert spark.conf.values == {SHUFFLE_PARTITIONS: "8", "spark.sql.adaptive.enabled": "true"}
