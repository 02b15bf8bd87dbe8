"""Every job of the demo pipeline in one Spark session: word_counts, then game_events.

    python -m federator_spark.jobs.pipeline --bootstrap-servers HOST:PORT --application-id APP \\
        [--events N] [--seed S] [--game-input PATH] [--master local[*]]

One driver instead of one per job: starting Spark (a JVM and its Python workers) costs
more than either job on the demo's data.
"""

from __future__ import annotations

import sys
from typing import Any

from federator_spark.jobs import game_events, word_counts
from federator_spark.jobs.common import parse, parser, run_job, step


def main(argv: list[str] | None = None) -> int:
    p = parser("pipeline", "Run word_counts and game_events in one Spark session.")
    p.add_argument("--events", type=int, default=1_000_000, help="game events to generate (default 1,000,000)")
    p.add_argument("--seed", type=int, default=42, help="generator seed (default 42)")
    p.add_argument("--game-input", default=game_events.DEFAULT_INPUT,
                   help=f"where the game events' Parquet goes (default {game_events.DEFAULT_INPUT})")
    args = parse(p, argv)
    if args.events < 1:
        p.error("--events must be at least 1")

    def both(spark: Any) -> dict[str, str]:
        step("job word_counts")
        tokens = word_counts.run(spark, args.bootstrap_servers, args.application_id, None, args.partitions)
        step("job game_events")
        return {**tokens, **game_events.run(spark, args.bootstrap_servers, args.application_id, args.game_input,
                                            args.events, args.seed, args.partitions)}

    return run_job(args.master, "federator-pipeline", both)


if __name__ == "__main__":
    sys.exit(main())
