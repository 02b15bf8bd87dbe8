"""`federator demo --exit`, the first Quick start command, runs end to end."""

from __future__ import annotations

import subprocess

from tests.conftest import federator_cmd, free_port


def test_demo_exit_runs_the_pipeline_and_answers(tmp_path) -> None:
    r = subprocess.run(
        federator_cmd("demo", "--exit", "--port", str(free_port()), "--dir", str(tmp_path / "demo")),
        capture_output=True, text=True, timeout=180,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.rstrip().endswith("==> done (--exit)")
    assert r.stdout.count("started node") == 3
    # the answers the demo prints are the real ones from its text
    import collections
    import re

    from federator.demo import TEXT

    counts = collections.Counter(w.lower() for w in re.findall(r"[A-Za-z]+", TEXT))
    answer = r.stdout.split("WHERE word = 'federator'")[1].splitlines()[3].split()
    assert answer == ["federator", str(counts["federator"])]
    totals = r.stdout.split("FROM word_counts\n")[1].splitlines()[2].split()
    assert totals == [str(len(counts)), str(sum(counts.values())), str(max(counts.values()))]
