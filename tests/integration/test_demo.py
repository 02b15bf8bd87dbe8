"""`federator demo --exit`, the first Quick start command, runs end to end."""

from __future__ import annotations

import subprocess

from tests.conftest import federator_cmd, free_port


def test_demo_exit_runs_the_pipeline_and_answers(tmp_path) -> None:
    r = subprocess.run(
        federator_cmd("demo", "--exit", "--events", "5000", "--port", str(free_port()), "--dir", str(tmp_path / "demo")),
        capture_output=True, text=True, timeout=400,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.rstrip().endswith("==> done (--exit)")
    assert r.stdout.count("started node") == 3
    # the answers the demo prints are the real ones from its text
    import collections
    import re

    from spark.jobs.word_counts import TEXT

    counts = collections.Counter(w.lower() for w in re.findall(r"[^\W\d_]+", TEXT))
    answer = r.stdout.split("WHERE word = 'federator'")[1].splitlines()[3].split()
    assert answer == ["federator", str(counts["federator"])]
    # the leaderboard stores came from the Spark job: 5000 events' worth of players
    players = r.stdout.split("AS best FROM player_stats\n")[1].splitlines()[2].split()
    assert int(players[0]) > 0 and "player_00007" in r.stdout.split("FROM player_sessions")[1]
    # the leaderboard plugin's store answers the top-k and the rank
    rank_part = r.stdout.split("QUALIFY player = 'player_00007'")[1]
    row = rank_part.splitlines()[3].split()
    assert row[0] == "player_00007" and int(row[2]) >= 1
