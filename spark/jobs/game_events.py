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

    python -m spark.jobs.game_events --bootstrap-servers HOST:PORT --application-id APP \\
        [--input PATH] [--events N] [--seed S] [--master local[*]]

The same seed and size give the same events, so a re-run leaves the same stores.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

from spark.jobs.common import finish, parser, spark_session, step
from spark.sink import write_store

DEFAULT_INPUT = ".federator/game_events/input"
BASE_MS = 1_704_067_200_000  # 2024-01-01T00:00:00Z
GAMES = 20
EVENTS_PER_PLAYER = 100
MEAN_GAP_MS = 20 * 60_000  # a player's events are ~20 minutes apart on average
WINDOW_MS = 60_000
SESSION_GAP = "30 minutes"


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


def write_events(spark: Any, input_path: str, events: int, seed: int) -> None:
    path = Path(input_path)
    if not _safe_to_overwrite(path):
        raise SystemExit(f"error: {path} holds files that are not Parquet parts; pass an empty or new --input folder")
    step(f"generating {events:,} events (seed {seed}, {players_for(events):,} players) into {path}")
    previous = spark.conf.get("spark.sql.parquet.outputTimestampType")
    spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")  # readable by any Parquet reader
    try:
        if path.exists():
            shutil.rmtree(path)
        generate(spark, events, seed).write.mode("overwrite").parquet(str(path))
    finally:
        spark.conf.set("spark.sql.parquet.outputTimestampType", previous)


def player_stats(events: Any) -> Any:
    from pyspark.sql import functions as F

    return events.groupBy("player").agg(
        F.countDistinct("game").cast("long").alias("games"),
        F.sum("score").cast("long").alias("total_score"),
        F.max("score").cast("long").alias("best_score"),
        F.max("ts").alias("last_seen"),
    )


def scores_per_minute(events: Any) -> Any:
    from pyspark.sql import functions as F

    return (events.groupBy("player", F.window("ts", "1 minute").alias("w"))
            .agg(F.sum("score").cast("long").alias("total_score"))
            .select("player", F.col("w.start").alias("window_start"), "total_score"))


def player_sessions(events: Any) -> Any:
    from pyspark.sql import functions as F

    return (events.groupBy("player", F.session_window("ts", SESSION_GAP).alias("s"))
            .agg(F.count(F.lit(1)).alias("games"), F.min("ts").alias("session_start"),
                 F.max("ts").alias("session_end"))
            .select("player", "session_start", "session_end", "games"))


def run(spark: Any, bootstrap: str, app: str, input_path: str = DEFAULT_INPUT, events: int = 1_000_000,
        seed: int = 42, partitions: int = 8, generate_input: bool = True) -> dict[str, str]:
    """Generate the events (unless ``generate_input`` is False), compute the three stores and
    write them; returns store -> consistency token."""
    if generate_input:
        write_events(spark, input_path, events, seed)
    step(f"reading events from {input_path}")
    ev = spark.read.parquet(str(input_path)).cache()
    try:
        step(f"{ev.count():,} events")
        common = dict(bootstrap_servers=bootstrap, application_id=app, partitions=partitions, progress=step)
        tokens = {}
        tokens["player_stats"] = write_store(
            player_stats(ev), "player_stats", key="player",
            value=["games", "total_score", "best_score", "last_seen"], mode="replace", **common)
        tokens["scores_per_minute"] = write_store(
            scores_per_minute(ev), "scores_per_minute", key="player", value="total_score", type="window",
            window_start="window_start", window_size_ms=WINDOW_MS, mode="replace", **common)
        tokens["player_sessions"] = write_store(
            player_sessions(ev), "player_sessions", key="player", value="games", type="session",
            session_start="session_start", session_end="session_end", mode="replace", **common)
    finally:
        ev.unpersist()
    return tokens


def main(argv: list[str] | None = None) -> int:
    p = parser("game_events", "Generate game events as Parquet and compute the leaderboard stores from them.")
    p.add_argument("--input", default=DEFAULT_INPUT, help=f"the events' Parquet folder (default {DEFAULT_INPUT})")
    p.add_argument("--events", type=int, default=1_000_000, help="events to generate (default 1,000,000)")
    p.add_argument("--seed", type=int, default=42, help="generator seed (default 42)")
    p.add_argument("--no-generate", action="store_true", help="read the Parquet already in --input instead")
    args = p.parse_args(argv)
    if args.events < 1:
        p.error("--events must be at least 1")
    step(f"starting Spark ({args.master})")
    spark = spark_session(args.master, "game_events")
    try:
        tokens = run(spark, args.bootstrap_servers, args.application_id, args.input, args.events, args.seed,
                     args.partitions, generate_input=not args.no_generate)
    finally:
        spark.stop()
    finish(tokens)
    return 0


if __name__ == "__main__":
    sys.exit(main())
