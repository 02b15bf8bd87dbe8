"""game_events --stream: after every micro-batch the stores, read back with SQL from a real
node, equal what the batch job computes over every file in the input folder so far."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from federator.query.position import Position
from federator_spark.jobs import game_events
from federator_spark.jobs.common import merged_token
from federator_spark.sink import SinkError, delete_keys
from tests.integration.cluster import Cluster
from tests.spark.conftest import P, changelog_records, rows, sql

pytestmark = pytest.mark.integration

STORES = {  # store -> the columns the SQL reads, in the order of expected()'s tuples
    "player_stats": "player, games, total_score, best_score, last_seen",
    "scores_per_minute": "player, window_start, window_end, total_score",
    "player_sessions": "player, window_start, window_end, games",
    "leaderboard": "player, total_score",
}


def expected(spark, files: list[Path]) -> dict[str, list[tuple]]:
    """The batch job's answer over ``files`` (times as epoch ms, rows sorted like ``rows``)."""
    from pyspark.sql import functions as F

    ev = spark.read.parquet(*map(str, files))
    ms = F.unix_millis
    frames = {
        "player_stats": game_events.player_stats(ev).select(
            "player", "games", "total_score", "best_score", ms("last_seen")),
        "scores_per_minute": game_events.scores_per_minute(ev).select(
            "player", ms("window_start"), ms("window_start") + game_events.WINDOW_MS, "total_score"),
        "player_sessions": game_events.player_sessions(ev).select(
            "player", ms("session_start"), ms("session_end"), "games"),
        "leaderboard": game_events.player_stats(ev).select("player", "total_score"),
    }
    return {store: sorted(tuple(r) for r in df.collect()) for store, df in frames.items()}


def stores(node, token: str) -> dict[str, list[tuple]]:
    return {store: rows(sql(node, f"SELECT {cols} FROM {store}", token)) for store, cols in STORES.items()}


def assert_same(got: dict[str, list[tuple]], want: dict[str, list[tuple]]) -> None:
    for store in STORES:
        extra, missing = set(got[store]) - set(want[store]), set(want[store]) - set(got[store])
        assert not extra and not missing, (f"{store}: {len(extra)} rows the batch answer lacks, e.g. "
                                           f"{sorted(extra)[:3]}; {len(missing)} missing, e.g. {sorted(missing)[:3]}")
        assert got[store] == want[store], f"{store}: duplicate rows"


def event_times(spark, file: Path) -> set[tuple[str, int]]:
    from pyspark.sql import functions as F

    return {(r[0], r[1]) for r in spark.read.parquet(str(file)).select("player", F.unix_millis("ts")).collect()}


def test_stream_keeps_the_stores_equal_to_the_batch_answer(broker, spark, tmp_path, monkeypatch):
    app = f"st{uuid.uuid4().hex[:8]}"
    inp, checkpoint = tmp_path / "game events", tmp_path / "checkpoint"  # a space: Spark names files by URI
    kw = dict(input_path=str(inp), checkpoint=str(checkpoint), partitions=P)
    first = game_events.generate_into(spark, str(inp), 2000, seed=21)  # 20 players
    assert len(first) == 1

    # micro-batch 0: the first file (the stream stops once it has read what is there)
    tokens = game_events.stream(spark, broker.bootstrap_servers, app, until_idle=True, **kw)
    assert set(tokens) == set(STORES)
    cluster = Cluster(broker.bootstrap_servers, app, tmp_path / "nodes", size=1, standby_replicas=0)
    try:
        cluster.start()
        for store in STORES:
            cluster.wait_settled(store, P, timeout=60)
        node = cluster.nodes[0]
        before = stores(node, merged_token(tokens))
        assert_same(before, expected(spark, first))

        # a second file, for 10 of those players over the same hours, dropped while the stream
        # runs with a processing-time trigger (restarted from the checkpoint); micro-batch 1
        # holds only its events, and the stream stops after it
        # (the sessions before and after compared by Spark, as for a micro-batch whose players
        # have too many sessions for the driver)
        second = game_events.generate_into(spark, str(inp), 1000, seed=22)
        assert len(second) == 1 and second != first
        with monkeypatch.context() as m:
            m.setattr(game_events, "DRIVER_DIFF_ROWS", 0)
            tokens = game_events.stream(spark, broker.bootstrap_servers, app, trigger_seconds=0.5, max_batches=1,
                                        **kw)
        after = stores(node, merged_token(tokens))
        assert_same(after, expected(spark, first + second))

        # micro-batch 2: a third file, the sessions compared on the driver
        third = game_events.generate_into(spark, str(inp), 1000, seed=23)
        tokens = game_events.stream(spark, broker.bootstrap_servers, app, until_idle=True, **kw)
        assert_same(stores(node, merged_token(tokens)), expected(spark, first + second + third))

        # stopped after micro-batch 2 wrote player_stats, leaderboard and scores_per_minute but
        # not player_sessions (Spark had not recorded it done): the restarted stream runs it
        # again and writes player_sessions only; the others' records are not produced twice
        counts = {store: changelog_records(broker.bootstrap_servers, app, store) for store in STORES}
        for f in (checkpoint / "commits").glob("*2*"):  # 2, .2.crc
            f.unlink()
        record = checkpoint / "federator-commits" / "2.json"
        written = json.loads(record.read_text())
        assert set(written) == set(STORES)
        record.write_text(json.dumps({s: t for s, t in written.items() if s != "player_sessions"}))
        again = game_events.stream(spark, broker.bootstrap_servers, app, until_idle=True, **kw)
        now = {store: changelog_records(broker.bootstrap_servers, app, store) for store in STORES}
        assert now["player_sessions"] > counts["player_sessions"]
        assert {s: n for s, n in now.items() if s != "player_sessions"} == \
            {s: n for s, n in counts.items() if s != "player_sessions"}
        assert {s: again[s] for s in STORES if s != "player_sessions"} == \
            {s: tokens[s] for s in STORES if s != "player_sessions"}
        assert_same(stores(node, merged_token(again)), expected(spark, first + second + third))
    finally:
        cluster.stop()

    # The files did what the test needs: totals moved for the second file's players only, ...
    stats0 = {r[0]: r[1:] for r in before["player_stats"]}
    stats1 = {r[0]: r[1:] for r in after["player_stats"]}
    moved = {p for p in stats0 if stats1[p] != stats0[p]}
    assert moved == {p for p, _ in event_times(spark, second[0])} and len(moved) < len(stats0)
    assert all(stats1[p][1] > stats0[p][1] for p in moved)  # total_score grew (scores are >= 0, most > 0)
    # ... sessions that the first file's events alone ended were merged with the second's (and
    # the old, shorter sessions were deleted, or the equality above would fail) ...
    merged_away = set(before["player_sessions"]) - set(after["player_sessions"])
    assert merged_away
    t1, t2 = event_times(spark, first[0]), event_times(spark, second[0])
    spanning = [(p, s, e) for p, s, e, _ in after["player_sessions"]
                if any(q == p and s <= t <= e for q, t in t1) and any(q == p and s <= t <= e for q, t in t2)]
    assert spanning

    # delete_keys (the sink's call for those deletions) checks its input against the store
    sink = dict(bootstrap_servers=broker.bootstrap_servers, application_id=app)
    ints = spark.createDataFrame([(1, 2, 3)], "player long, s long, e long")
    with pytest.raises(SinkError, match="has string keys"):
        delete_keys(ints, "player_sessions", key="player", session_start="s", session_end="e", **sink)
    with pytest.raises(SinkError, match="session_start= and session_end="):
        delete_keys(ints, "player_sessions", key="player", **sink)
    assert delete_keys(ints, "no_such_store", key="player", **sink) == Position().to_token()


@pytest.mark.parametrize("argv, message", [
    (["--application-id", "a", "--trigger-seconds", "1", "--until-idle"],
     "--trigger-seconds, --until-idle: only with --stream"),
    (["--application-id", "a", "--stream", "--generate-into", "d"], "not allowed with argument"),
    (["--application-id", "a", "--stream", "--no-generate"], "not allowed with argument"),
    (["--application-id", "a", "--stream", "--max-batches", "0"], "--max-batches must be at least 1"),
    (["--application-id", "a", "--stream", "--trigger-seconds", "0"], "--trigger-seconds must be positive"),
    (["--stream"], "required: --application-id"),
    ([], "required: --application-id"),  # batch mode still needs it; only --generate-into does not
])
def test_stream_options_are_checked_before_spark_starts(argv, message, capsys, monkeypatch):
    monkeypatch.delenv("FEDERATOR_APPLICATION_ID", raising=False)
    with pytest.raises(SystemExit) as e:
        game_events.main(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_a_summary_counts_a_read_cache_without_a_job(spark):
    """A micro-batch's summary says how many rows each store got: a cached frame that has been
    read knows its count (no Spark job); any other frame is counted."""
    from federator_spark.jobs import streaming

    sc = spark.sparkContext
    df = spark.range(1000).where("id % 3 = 0").cache()
    try:
        assert streaming.rows_in(df) == 334  # not read yet: counted
        df.collect()
        sc.setJobGroup("rows-in", "the summary's count")
        try:
            assert streaming.rows_in(df) == 334
            assert sc.statusTracker().getJobIdsForGroup("rows-in") == []
        finally:
            sc.setLocalProperty("spark.jobGroup.id", None)
    finally:
        df.unpersist()


def test_store_updates_side_by_side_keep_the_streams_job_group(spark):
    """Stopping a stream cancels its jobs by their group: the jobs the stores' updates start
    from their own threads must be in it too."""
    from federator_spark.jobs.streaming import in_parallel

    sc = spark.sparkContext
    sc.setJobGroup("federator-stream-test", "a micro-batch")
    try:
        group = lambda: sc.getLocalProperty("spark.jobGroup.id")  # noqa: E731
        assert in_parallel([[("a", group)], [("b", group)]], spark=spark) == {
            "a": "federator-stream-test", "b": "federator-stream-test"}
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)


@pytest.mark.parametrize("by_value", [True, False], ids=["keys filtered by value", "keys semi-joined"])
def test_a_micro_batch_reads_the_earlier_rows_of_its_keys_once(spark, tmp_path, monkeypatch, by_value):
    """Every store's update reads the earlier rows of the micro-batch's keys from one copy in
    memory: the earlier files are read once (gone afterwards, the rows are still there). Both
    ways of picking the rows (by the few keys' values, or a semi-join on many) give the same
    rows, and a null key matches nothing."""
    import shutil

    from federator_spark.jobs import streaming

    if not by_value:
        monkeypatch.setattr(streaming, "TOUCHED_BY_VALUE", 0)
    schema = "k string, v long"
    earlier = tmp_path / "earlier"
    spark.createDataFrame([("a", 1), ("b", 2), (None, 3), ("c", 4), ("a", 5)], schema).write.parquet(str(earlier))
    new = spark.createDataFrame([("a", 10), (None, 11), ("d", 12)], schema).cache()
    mb = streaming.MicroBatch(spark, 1, schema, new, ["new"], [str(earlier)])
    by = lambda r: (r[0] or "", r[1])  # noqa: E731
    try:
        mb.marked("k")
        shutil.rmtree(earlier)
        assert sorted(map(tuple, mb.earlier("k").collect()), key=by) == [("a", 1), ("a", 5)]
        assert sorted(map(tuple, mb.so_far("k").collect()), key=by) == [
            (None, 11), ("a", 1), ("a", 5), ("a", 10), ("d", 12)]
        assert mb.so_far("k").columns == ["k", "v"]
    finally:
        mb.release()
        new.unpersist()


def test_only_the_stream_job_starts_spark_with_the_quick_jit(monkeypatch):
    """The stream's driver JVM compiles with C1 only (streaming.JAVA_OPTIONS); a batch run
    keeps the default JIT, which is faster over large data."""
    from federator_spark.jobs import streaming

    asked = []
    monkeypatch.setattr(game_events, "run_job", lambda master, name, job, java_options=(): asked.append(java_options))
    game_events.main(["--application-id", "a", "--stream"])
    game_events.main(["--application-id", "a", "--no-generate"])
    assert asked == [streaming.JAVA_OPTIONS, ()] and "-XX:TieredStopAtLevel=1" in streaming.JAVA_OPTIONS
