"""The sink through the real broker and real nodes: every format and store type round-trips,
re-runs leave the same store, replace deletes, and the token gives read-your-writes."""

from __future__ import annotations

import base64
import math
import time

import pytest

from federator import kafka
from federator.catalog import Catalog
from federator.query.position import Position
from tests.integration.changelog_util import read_partition
from tests.spark.conftest import (BYTES_ROWS, DOUBLE_ROWS, INT_ROWS, JSON_ROWS, LONG_ROWS, P, REPLACE_KV,
                                  REPLACE_WIN, RYW_ROWS, SESSION_ROWS, STRING_ROWS, T0, WINDOW_ROWS, explain, rows,
                                  sql, sql_with_token)
from tests.registry import REGISTRY

pytestmark = [pytest.mark.integration, pytest.mark.apache_kafka]


def nan_safe(rows_: list[tuple]) -> list[tuple]:
    return sorted((tuple("NaN" if isinstance(v, float) and math.isnan(v) else v for v in r) for r in rows_),
                  key=lambda r: tuple((x is None, repr(type(x)), x if x is not None else 0) for x in r))


EXPECTED = {
    "rt_string": (["name", "label"], STRING_ROWS),
    "rt_long": (["id", "amount"], LONG_ROWS),
    "rt_int": (["id", "n"], INT_ROWS),
    "rt_double": (["x", "y"], DOUBLE_ROWS),
    "rt_bytes": (["k", "b"], BYTES_ROWS),
    "rt_json": (["player", "team", "score", "level", "ratio", "active", "seen"], JSON_ROWS),
    "rt_window": (["player", "window_start", "window_end", "points"],
                  [(p, s, s + 60_000, v) for p, s, v in WINDOW_ROWS]),
    "rt_session": (["id", "window_start", "window_end", "games", "label"], SESSION_ROWS),
}


@pytest.mark.parametrize("store", list(EXPECTED))
def test_round_trip(world, store):
    columns, expected = EXPECTED[store]
    table = sql(world.node, f"SELECT * FROM {store}", world.tokens[store])
    assert table.column_names == columns
    assert rows(table) == nan_safe(expected), explain(world, store, world.tokens[store])


def test_definitions_follow_the_spark_types(world):
    stores = Catalog(world.bootstrap, world.app, REGISTRY).load()
    assert (stores["rt_long"].key_format, stores["rt_long"].value_format) == ("long", "long")
    assert (stores["rt_int"].key_format, stores["rt_int"].value_name) == ("int", "n")
    assert (stores["rt_bytes"].key_format, stores["rt_bytes"].value_format) == ("bytes", "bytes")
    assert stores["rt_json"].value_fields == (("team", "string"), ("score", "long"), ("level", "int"),
                                              ("ratio", "double"), ("active", "boolean"), ("seen", "timestamp"))
    assert (stores["rt_window"].type, stores["rt_window"].window_size_ms) == ("window", 60_000)
    assert stores["rt_session"].type == "session" and stores["rt_session"].partitions == P


def test_record_layout_and_timestamps(world):
    """Window records: key + start + seqnum 0, stamped with the start, in the plain key's partition."""
    from federator.partitioner import partition_for
    from federator.store.layout import split_session_key, split_window_key

    defn = Catalog(world.bootstrap, world.app, REGISTRY).get("rt_window")
    seen = set()
    for p in range(P):
        for _, key, value, stamp in read_partition(world, defn.topic, p):
            plain, start, seq = split_window_key(key)
            assert (seq, stamp, partition_for(plain, P)) == (0, start, p)
            seen.add((plain.decode(), start, int.from_bytes(value, "big", signed=True)))
    assert seen == set(WINDOW_ROWS)
    defn = Catalog(world.bootstrap, world.app, REGISTRY).get("rt_session")
    for p in range(P):
        for _, key, _, stamp in read_partition(world, defn.topic, p):
            plain, start, end = split_session_key(key)
            assert stamp == end and partition_for(plain, P) == p
    defn = Catalog(world.bootstrap, world.app, REGISTRY).get("rt_string")
    stamps = {stamp for p in range(P) for *_, stamp in read_partition(world, defn.topic, p)}
    assert len(stamps) == 1 and abs(stamps.pop() / 1000 - time.time()) < 600  # kv: the write's time


def test_token_is_the_last_offset_of_each_partition(world):
    topic = Catalog(world.bootstrap, world.app, REGISTRY).get("rt_string").topic
    token = Position.from_token(world.tokens["rt_string"])
    last = {}
    for p in range(P):
        recs = read_partition(world, topic, p)
        if recs:
            last[p] = recs[-1][0]
    assert token.partitions(topic) == last
    assert sum(1 for _ in token) == len(last)


def test_rerun_leaves_the_same_store(world):
    for store in ("rt_json", "rt_session"):
        before = rows(sql(world.node, f"SELECT * FROM {store}", world.tokens[store]))
        token = world.write(store)
        assert Position.from_token(token) != Position.from_token(world.tokens[store])  # new records were written
        assert rows(sql(world.node, f"SELECT * FROM {store}", token)) == before, explain(world, store, token)


def test_replace_deletes_missing_keys(world, spark):
    df = spark.createDataFrame([(f"k{i:02d}", i * 100) for i in range(5, 15)], "k string, v long")
    token = world.write("replace_kv", df, mode="replace")
    assert rows(sql(world.node, "SELECT k, v FROM replace_kv", token)) == [(f"k{i:02d}", i * 100) for i in range(5, 15)], \
        explain(world, "replace_kv", token)
    # upsert keeps what the DataFrame does not mention
    token = world.write("replace_kv", spark.createDataFrame([("k00", 0)], "k string, v long"))
    got = rows(sql(world.node, "SELECT k FROM replace_kv", token))
    assert got == [("k00",)] + [(f"k{i:02d}",) for i in range(5, 15)], explain(world, "replace_kv", token)
    assert not {k for k, _ in REPLACE_KV[1:5]} & {k for (k,) in got}


def test_replace_deletes_missing_windows(world, spark):
    keep = [r for r in REPLACE_WIN if r[0] == "a" or r[1] == T0]  # all of a, only b's first window
    token = world.write("replace_win", spark.createDataFrame(keep, "k string, ws long, v long"), mode="replace")
    got = rows(sql(world.node, "SELECT k, window_start, v FROM replace_win", token))
    assert got == sorted(keep), explain(world, "replace_win", token)


def test_replace_with_an_empty_frame_empties_the_store(world, spark):
    world.write("replace_kv", spark.createDataFrame([("z", 1)], "k string, v long"))
    token = world.write("replace_kv", spark.createDataFrame([], "k string, v long"), mode="replace")
    assert rows(sql(world.node, "SELECT * FROM replace_kv", token)) == [], explain(world, "replace_kv", token)


def test_token_gives_read_your_writes(world, spark):
    for version in (2, 3):
        df = spark.createDataFrame([(k, version) for k, _ in RYW_ROWS] + [(f"new{version}", version)],
                                   "k string, v long")
        token = world.write("ryw", df)
        written = Position.from_token(token)
        assert {t for t, _, _ in written} == {f"{world.app}-ryw-changelog"}
        assert all(o >= 0 and 0 <= p < P for _, p, o in written)
        got, answer_token = sql_with_token(world.node, f"SELECT k, v FROM ryw WHERE v = {version}", token)
        assert got.num_rows == len(RYW_ROWS) + 1, explain(world, "ryw", token)
        # the answer's token covers the write's: every partition written, at or past its offset
        answered = Position.from_token(answer_token)
        short = {(t, p): (o, answered.get(t, p)) for t, p, o in written if (answered.get(t, p) or -1) < o}
        assert not short, f"(topic, partition): (written, answered) {short}"


def test_the_word_counts_cli(world):
    assert "consistency token:" in world.cli_output
    token = world.tokens["word_counts"]
    assert base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))  # a Federator token
    assert kafka.topic_partitions(kafka.admin(world.bootstrap), f"{world.app}-word_counts-changelog") == P
