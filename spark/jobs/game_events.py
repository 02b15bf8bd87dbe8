"""game_events: a gaming company's real-time leaderboard.

A seeded generator writes player/game/score events (player string, game string, score long,
ts timestamp) as Parquet into the input folder; the job reads them back and writes:

- ``player_stats`` (kv, key ``player``, a JSON record): ``games`` (distinct games played),
  ``total_score``, ``best_score``, ``last_seen`` (the latest event)
- ``scores_per_minute`` (window store, tumbling 1 minute): player -> ``total_score``
- ``player_sessions`` (session store, 30-minute inactivity gap, Spark's session_window):
  player -> ``games``, the events (rounds played) in the session. As in Kafka Streams, a
  session starts at its first event and ends at its last (``window_end``); a gap of 30
  minutes or more starts a new session.

    python -m federator_spark.jobs.game_events --bootstrap-servers HOST:PORT --application-id APP \\
        [--input PATH] [--events N] [--seed S] [--master local[*]]

The same seed and size give the same events, so a re-run leaves the same stores.

Streaming: ``--stream`` keeps the same stores equal to the batch answer over every Parquet
file in --input as new files arrive (see spark/jobs/streaming.py for how), and
``--generate-into DIR`` adds one new file of generated events to a folder:

    python -m federator_spark.jobs.game_events --application-id APP --stream [--input PATH] \\
        [--checkpoint DIR] [--trigger-seconds S] [--max-batches N] [--until-idle]
    python -m federator_spark.jobs.game_events --generate-into PATH --events N --seed S
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import pyarrow.compute as pc

from federator.plugin import load_plugins
from federator_spark.jobs import streaming
from federator_spark.jobs.common import merged_token, parse, parser, run_job, step
from federator_spark.sink import delete_keys, write_store

DEFAULT_INPUT = ".federator/game_events/input"
BASE_MS = 1_704_067_200_000  # 2024-01-01T00:00:00Z
GAMES = 20
EVENTS_PER_PLAYER = 100
MEAN_GAP_MS = 20 * 60_000  # a player's events are ~20 minutes apart on average
WINDOW_MS = 60_000
SESSION_GAP = "30 minutes"
EVENTS_SCHEMA = "player string, game string, score long, ts timestamp"


def players_for(events: int) -> int:
    return max(10, min(100_000, events // EVENTS_PER_PLAYER))


def generate(spark: Any, events: int, seed: int) -> Any:
    """The events as a DataFrame, computed from spark.range: no data passes through Python.

    Each column is a hash of (event id, seed, column), so the same seed gives the same events.
    A player's events spread uniformly over EVENTS_PER_PLAYER mean gaps, so sessions of a
    few events separated by gaps of more than 30 minutes both occur, at any size.
    """
    from pyspark.sql import functions as F

    players = players_for(events)
    span_ms = EVENTS_PER_PLAYER * MEAN_GAP_MS

    def h(salt: int) -> Any:
        return F.xxhash64(F.col("id"), F.lit(seed), F.lit(salt))

    return spark.range(events).select(
        F.format_string("player_%05d", F.pmod(h(1), F.lit(players))).alias("player"),
        F.format_string("game_%02d", F.pmod(h(2), F.lit(GAMES))).alias("game"),
        F.pmod(h(3), F.lit(1000)).cast("long").alias("score"),
        F.timestamp_millis(F.lit(BASE_MS) + F.pmod(h(4), F.lit(span_ms))).alias("ts"),
    )


def _safe_to_overwrite(path: Path) -> bool:
    """Only a folder this generator (Spark) wrote, or an empty one, is replaced."""
    if not path.exists():
        return True
    if not path.is_dir():
        return False
    names = [p.name for p in path.iterdir()]
    return all(n.startswith(("part-", "_SUCCESS", ".part-", "._SUCCESS", "_committed", "_started")) for n in names)


def _write_parquet(spark: Any, df: Any, path: Path) -> None:
    previous = spark.conf.get("spark.sql.parquet.outputTimestampType")
    spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")  # readable by any Parquet reader
    try:
        df.write.mode("overwrite").parquet(str(path))
    finally:
        spark.conf.set("spark.sql.parquet.outputTimestampType", previous)


def write_events(spark: Any, input_path: str, events: int, seed: int) -> None:
    path = Path(input_path)
    if not _safe_to_overwrite(path):
        raise SystemExit(f"error: {path} holds files that are not Parquet parts; pass an empty or new --input folder")
    step(f"generating {events:,} events (seed {seed}, {players_for(events):,} players) into {path}")
    if path.exists():
        shutil.rmtree(path)
    _write_parquet(spark, generate(spark, events, seed), path)


def generate_into(spark: Any, folder: str, events: int, seed: int) -> list[Path]:
    """Add one new Parquet file of ``events`` generated events to ``folder`` (made if missing);
    returns the new file(s).

    The file is written into a hidden staging folder (``_`` names are invisible to Spark's
    readers) and renamed in, so a stream never reads half a file. Spark's part names carry
    the write's UUID, so they never collide with the files already there, and the folder
    stays one that batch mode reads (and may regenerate).
    """
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    staging = path / f"_staging-{uuid.uuid4().hex}"
    step(f"generating {events:,} events (seed {seed}, {players_for(events):,} players) into {path}")
    try:
        _write_parquet(spark, generate(spark, events, seed).coalesce(1), staging)
        added = []
        for part in sorted(staging.glob("part-*.parquet")):
            target = path / part.name
            if target.exists():  # cannot happen with UUID names; never overwrite a file a stream read
                raise SystemExit(f"error: {target} exists already")
            os.rename(part, target)
            added.append(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    for f in added:
        step(f"added {f}")
    return added


def player_stats(events: Any) -> Any:
    from pyspark.sql import functions as F

    return events.groupBy("player").agg(
        F.countDistinct("game").cast("long").alias("games"),
        F.sum("score").cast("long").alias("total_score"),
        F.max("score").cast("long").alias("best_score"),
        F.max("ts").alias("last_seen"),
    )


def scores_per_minute(events: Any, **also: Any) -> Any:
    """``also``: name -> aggregate, more columns per window (the stream's "has new events")."""
    from pyspark.sql import functions as F

    return (events.groupBy("player", F.window("ts", "1 minute").alias("w"))
            .agg(F.sum("score").cast("long").alias("total_score"), *(c.alias(n) for n, c in also.items()))
            .select("player", F.col("w.start").alias("window_start"), "total_score", *also))


def player_sessions(events: Any, *by: str) -> Any:
    """Sessions per player (and per ``by`` columns, kept in front)."""
    from pyspark.sql import functions as F

    return (events.groupBy(*by, "player", F.session_window("ts", SESSION_GAP).alias("s"))
            .agg(F.count(F.lit(1)).alias("games"), F.min("ts").alias("session_start"),
                 F.max("ts").alias("session_end"))
            .select(*by, "player", "session_start", "session_end", "games"))


# ---- the stores: one writer each, shared by the batch run and the stream ------------------
def write_player_stats(stats: Any, mode: str, sink: dict[str, Any]) -> str:
    return write_store(stats, "player_stats", key="player", value=["games", "total_score", "best_score", "last_seen"],
                       mode=mode, **sink)


def write_scores_per_minute(scores: Any, mode: str, sink: dict[str, Any]) -> str:
    return write_store(scores, "scores_per_minute", key="player", value="total_score", type="window",
                       window_start="window_start", window_size_ms=WINDOW_MS, mode=mode, **sink)


def write_player_sessions(sessions: Any, mode: str, sink: dict[str, Any]) -> str:
    return write_store(sessions, "player_sessions", key="player", value="games", type="session",
                       session_start="session_start", session_end="session_end", mode=mode, **sink)


def write_leaderboard(stats: Any, mode: str, sink: dict[str, Any]) -> str:
    """Total scores in a global ``leaderboard`` store (the leaderboard plugin): every node keeps
    every player, so the node asked answers top-k and a player's rank from its own score index,
    with no call to another node."""
    return write_store(stats.select("player", "total_score"), "leaderboard", key="player", value="total_score",
                       type="leaderboard", mode=mode, global_store=True, **sink)


def run(spark: Any, bootstrap: str, app: str, input_path: str = DEFAULT_INPUT, events: int = 1_000_000,
        seed: int = 42, partitions: int = 8, generate_input: bool = True) -> dict[str, str]:
    """Generate the events (unless ``generate_input`` is False), compute the stores and
    write them; returns store -> consistency token."""
    if generate_input:
        write_events(spark, input_path, events, seed)
    step(f"reading events from {input_path}")
    ev = spark.read.parquet(str(input_path)).cache()
    try:
        step(f"{ev.count():,} events")
        common = dict(bootstrap_servers=bootstrap, application_id=app, partitions=partitions, progress=step)
        tokens = {}
        stats = player_stats(ev).cache()
        tokens["player_stats"] = write_player_stats(stats, "replace", common)
        tokens["leaderboard"] = write_leaderboard(stats, "replace", common)
        stats.unpersist()
        tokens["scores_per_minute"] = write_scores_per_minute(scores_per_minute(ev), "replace", common)
        tokens["player_sessions"] = write_player_sessions(player_sessions(ev), "replace", common)
    finally:
        ev.unpersist()
    return tokens


# ---- streaming: each store's update from one micro-batch ---------------------------------
# Each recomputes the keys the micro-batch touches over every event seen so far and upserts
# them (spark/jobs/streaming.py); it returns (consistency token, summary).
@contextmanager
def _cached(*frames: Any) -> Iterator[list[Any]]:
    """The frames cached while in use: each is counted and written, or used twice."""
    frames_ = [f.cache() for f in frames]
    try:
        yield frames_
    finally:
        for f in frames_:
            f.unpersist()


def _touched_player_stats(mb: streaming.MicroBatch) -> Any:
    """player_stats over every event of the micro-batch's players, computed once for both
    stores that hold it."""
    return mb.shared("player_stats", lambda: player_stats(mb.so_far("player")))


def stream_player_stats(mb: streaming.MicroBatch, sink: dict[str, Any]) -> tuple[str, str]:
    stats = _touched_player_stats(mb)
    return write_player_stats(stats, "upsert", sink), f"{streaming.rows_in(stats)} players"


def stream_leaderboard(mb: streaming.MicroBatch, sink: dict[str, Any]) -> tuple[str, str]:
    stats = _touched_player_stats(mb)
    return write_leaderboard(stats, "upsert", sink), f"{streaming.rows_in(stats)} players"


def stream_scores_per_minute(mb: streaming.MicroBatch, sink: dict[str, Any]) -> tuple[str, str]:
    from pyspark.sql import functions as F

    # only the minutes that have new events change
    windows = scores_per_minute(mb.marked("player"), touched=F.max(streaming.NEW_ROW))
    with _cached(windows.where("touched").drop("touched")) as (scores,):
        return write_scores_per_minute(scores, "upsert", sink), f"{streaming.rows_in(scores)} windows"


def stream_player_sessions(mb: streaming.MicroBatch, sink: dict[str, Any]) -> tuple[str, str]:
    """New events extend sessions or merge them (a gap bridged across files): write the
    sessions that differ from before and delete the ones that no longer exist, which have
    other keys (a session's key holds its start and end).

    The sessions before and after the micro-batch come from one aggregation (the earlier rows
    tagged 0, every row so far tagged 1). When they are few (the micro-batch's players' own),
    the driver tells which changed; else Spark does, in jobs of its own."""
    from pyspark.sql import functions as F

    tagged = (mb.earlier("player").withColumn("after", F.lit(False))
              .unionByName(mb.so_far("player").withColumn("after", F.lit(True))))
    both = player_sessions(tagged, "after")
    table = both.limit(DRIVER_DIFF_ROWS + 1).toArrow()
    if table.num_rows > DRIVER_DIFF_ROWS:
        return _sessions_diffed_by_spark(both, sink)
    after = table.filter(table.column("after")).drop_columns(["after"])
    before = table.filter(pc.invert(table.column("after"))).drop_columns(["after"])
    changed = after.join(before, keys=after.column_names, join_type="left anti")
    ids = ["player", "session_start", "session_end"]
    gone = before.select(ids).join(after.select(ids), keys=ids, join_type="left anti")
    spark = mb.spark
    token = write_player_sessions(spark.createDataFrame(changed), "upsert", sink) if changed.num_rows else None
    removed = _delete_sessions(spark.createDataFrame(gone), sink) if gone.num_rows else None
    tokens = {k: t for k, t in (("written", token), ("deleted", removed)) if t is not None}
    return merged_token(tokens), f"{changed.num_rows} sessions written, {gone.num_rows} merged away"


# Sessions before and after a micro-batch up to this many rows are compared on the driver: a
# micro-batch of 10,000 events over 1M earlier ones has ~3,000.
DRIVER_DIFF_ROWS = 500_000


def _sessions_diffed_by_spark(both: Any, sink: dict[str, Any]) -> tuple[str, str]:
    from pyspark.sql import functions as F

    ids = ["player", "session_start", "session_end"]
    tag = F.col("after")
    with _cached(both.where(~tag).drop("after"), both.where(tag).drop("after")) as (before, after):
        with _cached(after.subtract(before), before.select(*ids).subtract(after.select(*ids))) as (changed, gone):
            token = write_player_sessions(changed, "upsert", sink)
            removed = _delete_sessions(gone, sink)
            summary = f"{streaming.rows_in(changed)} sessions written, {streaming.rows_in(gone)} merged away"
    return merged_token({"written": token, "deleted": removed}), summary


def _delete_sessions(gone: Any, sink: dict[str, Any]) -> str:
    # after the write, so a reader never misses a player's events; a crash in between leaves
    # both, and Spark's re-run of the micro-batch deletes the old ones
    return delete_keys(gone, "player_sessions", key="player", session_start="session_start",
                       session_end="session_end", bootstrap_servers=sink["bootstrap_servers"],
                       application_id=sink["application_id"], registry=sink.get("registry"))


STREAM_UPDATES = {
    "player_stats": stream_player_stats,
    "leaderboard": stream_leaderboard,
    "scores_per_minute": stream_scores_per_minute,
    "player_sessions": stream_player_sessions,
}


# Stores updated one after the other (they share a cached frame); the groups are updated side
# by side (streaming.in_parallel)
STREAM_GROUPS = (("player_stats", "leaderboard"), ("scores_per_minute",), ("player_sessions",))


def update_stores(mb: streaming.MicroBatch, sink: dict[str, Any],
                  updates: Mapping[str, Callable[..., tuple[str, str]]] = STREAM_UPDATES) -> dict[str, tuple[str, str]]:
    """Every store's update from one micro-batch, each written once by it (``MicroBatch.once``):
    store -> (consistency token, summary)."""
    return streaming.in_parallel([[(store, functools.partial(mb.once, store, functools.partial(updates[store], mb, sink)))
                                   for store in group] for group in STREAM_GROUPS], spark=mb.spark)


def stream_sink(bootstrap: str, app: str, partitions: int) -> dict[str, Any]:
    """The write options every micro-batch's updates share; one plugin registry for every
    write of the run (loading the plugins costs ~25 ms a write)."""
    return dict(bootstrap_servers=bootstrap, application_id=app, partitions=partitions, registry=load_plugins())


def stream(spark: Any, bootstrap: str, app: str, input_path: str = DEFAULT_INPUT, checkpoint: str | None = None,
           partitions: int = 8, trigger_seconds: float = 5.0, max_batches: int | None = None,
           until_idle: bool = False) -> dict[str, str]:
    """Keep the stores equal to ``run``'s answer over every file in ``input_path`` as new files
    arrive, written in upsert mode; returns store -> consistency token."""
    sink = stream_sink(bootstrap, app, partitions)

    return streaming.run(spark, input_path, checkpoint or default_checkpoint(input_path), EVENTS_SCHEMA,
                         lambda mb: update_stores(mb, sink),
                         trigger_seconds=trigger_seconds, max_batches=max_batches, until_idle=until_idle)


def default_checkpoint(input_path: str) -> str:
    """Beside the input folder, not in it: batch mode may regenerate that folder."""
    p = Path(os.path.abspath(input_path))
    return str(p.with_name(p.name + "-checkpoint"))


def main(argv: list[str] | None = None) -> int:
    p = parser("game_events", "Generate game events as Parquet and compute the leaderboard stores from them.",
               require_app=False)
    p.add_argument("--input", default=DEFAULT_INPUT, help=f"the events' Parquet folder (default {DEFAULT_INPUT})")
    p.add_argument("--events", type=int, default=1_000_000, help="events to generate (default 1,000,000)")
    p.add_argument("--seed", type=int, default=42, help="generator seed (default 42)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--no-generate", action="store_true", help="read the Parquet already in --input instead")
    mode.add_argument("--stream", action="store_true",
                      help="keep the stores up to date as new Parquet files arrive in --input (Structured Streaming)")
    mode.add_argument("--generate-into", metavar="DIR",
                      help="only add one new Parquet file of --events events (--seed) to DIR, and exit")
    s = p.add_argument_group("--stream options")
    s.add_argument("--checkpoint", help="the stream's checkpoint folder (default: --input's path + '-checkpoint')")
    s.add_argument("--trigger-seconds", type=float, help="start a micro-batch every S seconds (default 5)")
    s.add_argument("--max-batches", type=int, help="stop after N micro-batches")
    s.add_argument("--until-idle", action="store_true", help="stop once every file in --input now has been read")
    args = parse(p, argv)
    if args.events < 1:
        p.error("--events must be at least 1")
    if not args.generate_into and not args.application_id:
        p.error("the following arguments are required: --application-id")
    stream_opts = {"--checkpoint": args.checkpoint, "--trigger-seconds": args.trigger_seconds,
                   "--max-batches": args.max_batches, "--until-idle": args.until_idle or None}
    if not args.stream and any(v is not None for v in stream_opts.values()):
        p.error(f"{', '.join(k for k, v in stream_opts.items() if v is not None)}: only with --stream")
    if args.trigger_seconds is not None and args.trigger_seconds <= 0:
        p.error("--trigger-seconds must be positive")
    if args.max_batches is not None and args.max_batches < 1:
        p.error("--max-batches must be at least 1")

    def job(spark: Any) -> dict[str, str] | None:
        if args.generate_into:
            generate_into(spark, args.generate_into, args.events, args.seed)
            return None
        if args.stream:
            return stream(spark, args.bootstrap_servers, args.application_id, args.input, args.checkpoint,
                          args.partitions, args.trigger_seconds or 5.0, args.max_batches, args.until_idle)
        return run(spark, args.bootstrap_servers, args.application_id, args.input, args.events, args.seed,
                   args.partitions, generate_input=not args.no_generate)

    return run_job(args.master, "game_events", job, streaming.JAVA_OPTIONS if args.stream else ())


if __name__ == "__main__":
    sys.exit(main())
