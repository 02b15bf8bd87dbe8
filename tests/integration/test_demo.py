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
    assert "KeyQuery('federator') on partition" in r.stdout
    assert r.stdout.rstrip().endswith("==> done (--exit)")
    # the word count the demo prints is the real one from its text
    from federator.demo import TEXT

    assert f": {TEXT.lower().split().count('federator')}\n" in r.stdout.split("KeyQuery('federator')")[1]
