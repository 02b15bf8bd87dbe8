"""The split of the default run into shards (tests/shards.py) and how their exits combine
(tests/run_shards.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import run_shards, shards

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Item:  # what the split reads of a pytest item
    nodeid: str
    fixturenames: tuple[str, ...] = ()


def items(spec: dict[str, tuple[int, tuple[str, ...]]]) -> list[Item]:
    """``count`` tests of each module, using ``fixtures``."""
    return [Item(f"{module}::test_{i}", fixtures) for module, (count, fixtures) in spec.items() for i in range(count)]


def loads(split: list[set[str]], times: dict[str, list[float]]) -> list[float]:
    return [sum(times[m][0] for m in shard) for shard in split]


def test_the_shards_are_disjoint_and_together_take_every_module() -> None:
    spec = {f"tests/unit/test_{c}.py": (i + 1, ()) for i, c in enumerate("abcdefg")}
    for n in (1, 2, 3):
        split = shards.assign(items(spec), n, {})
        assert sum(len(s) for s in split) == len(spec)
        assert set().union(*split) == set(spec)


def test_modules_sharing_a_costly_session_fixture_run_in_one_shard() -> None:
    spec = {
        "tests/spark/test_sink.py": (5, ("broker", "spark", "world")),
        "tests/spark/test_murmur.py": (2, ("spark",)),
        "tests/spark/test_jobs.py": (3, ("world",)),
        "tests/integration/test_dbapi.py": (4, ("bi_cluster",)),
        "tests/integration/test_fuzz.py": (1, ("bi_cluster", "fuzz_db")),
        "tests/unit/test_a.py": (9, ()),
        "tests/unit/test_b.py": (9, ()),
    }
    times = {m: [10.0, count] for m, (count, _) in spec.items()}  # balanced alone, they would split
    split = shards.assign(items(spec), 2, times)
    spark = {m for m in spec if "spark" in m}
    bi = {"tests/integration/test_dbapi.py", "tests/integration/test_fuzz.py"}
    assert [s for s in split if s & spark] == [s for s in split if spark <= s]
    assert [s for s in split if s & bi] == [s for s in split if bi <= s]


def test_the_split_evens_out_the_recorded_times() -> None:
    times = {"tests/integration/test_a.py": [100.0, 10], "tests/integration/test_b.py": [60.0, 2],
             "tests/integration/test_c.py": [50.0, 5], "tests/unit/test_d.py": [10.0, 100]}
    spec = {m: (count, ()) for m, (_, count) in times.items()}
    assert sorted(loads(shards.assign(items(spec), 2, times), times)) == [110.0, 110.0]


def test_a_module_counts_the_tests_selected_and_an_unrecorded_one_the_median_per_test() -> None:
    times = {"tests/x/test_a.py": [100.0, 10], "tests/x/test_b.py": [4.0, 4], "tests/x/test_c.py": [3.0, 1]}
    spec = {"tests/x/test_a.py": (2, ()), "tests/x/test_new.py": (5, ())}  # -k left 2 of test_a's 10
    assert shards.weights(items(spec), times) == {"tests/x/test_a.py": 20.0, "tests/x/test_new.py": 15.0}


def test_record_sums_each_modules_testcases(tmp_path: Path) -> None:
    report = tmp_path / "junit.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.unit.test_a" name="test_one" time="1.5"/>'
        '<testcase classname="tests.unit.test_a.TestGroup" name="test_two" time="0.25"/>'
        '<testcase classname="tests.spark.test_sink" name="test_rt[kafka-x]" time="30"/>'
        '</testsuite></testsuites>')
    assert shards.record([report]) == {"tests/spark/test_sink.py": [30.0, 1], "tests/unit/test_a.py": [1.75, 2]}


def collect_shard(shard: str, *modules: str) -> tuple[set[str], int]:
    """The tests ``pytest --shard`` selects of ``modules``, and how many it deselected."""
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "--shard", shard, *modules], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    deselected = re.search(r"\((\d+) deselected\)", done.stdout)
    return {line for line in done.stdout.splitlines() if "::" in line}, int(deselected.group(1)) if deselected else 0


def test_pytest_shards_take_disjoint_modules_that_together_are_the_whole_run() -> None:
    modules = ["tests/unit/test_shards.py", "tests/unit/test_limits.py", "tests/unit/test_position.py"]
    (first, left_by_first), (second, left_by_second) = (collect_shard(k, *modules) for k in ("1/2", "2/2"))
    assert first and second
    assert not {shards.module_of(Item(t)) for t in first} & {shards.module_of(Item(t)) for t in second}
    assert (len(second), len(first)) == (left_by_first, left_by_second)  # what one leaves, the other takes


@pytest.mark.parametrize("value", ["3/2", "0/2", "two"])
def test_a_wrong_shard_is_refused_saying_what_it_takes(value: str) -> None:
    with pytest.raises(pytest.UsageError, match="--shard"):
        shards.parse(value)


@pytest.mark.parametrize(("codes", "expected"), [
    ([0, 0], 0), ([0, 1], 1), ([2, 1], 2), ([5, 0], 0), ([0, 5], 0), ([5, 5], 5), ([5, 1], 1),
])
def test_the_run_passes_only_when_every_shard_did(codes: list[int], expected: int) -> None:
    assert run_shards.exit_code(codes) == expected


def test_the_shards_stop_together_when_asked_to_stop_at_a_failure() -> None:
    assert run_shards.stops_at_first_failure(["-x", "-k", "stream"])
    assert run_shards.stops_at_first_failure(["--maxfail=2"])
    assert not run_shards.stops_at_first_failure(["-k", "x"])
