"""Which test modules a shard of the default run takes (``pytest --shard K/N``; tests/run_shards.py
starts the N shards side by side).

The run is mostly waiting on brokers, nodes and JVMs, so two pytest processes finish it in about
half the time on two cores. Each shard takes whole modules (their module-scoped clusters start
once), modules that share a session fixture named in ``SHARED`` stay in one shard (it starts
once), and the groups are spread by their recorded times (``module_times.json``), the longest
first, each to the shard with the least so far. Both processes collect the same tests and
compute the same split, so the shards are disjoint and together run every selected test.

``python -m tests.shards JUNIT.xml ...`` records the modules' times from a run's JUnit reports.
"""

from __future__ import annotations

import json
import statistics
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path
from typing import Iterable, Sequence

import pytest

TIMES = Path(__file__).resolve().parent / "module_times.json"
# session fixtures costly to start that several modules share: their users run in one shard
SHARED = ("spark", "world", "bi_cluster")


def parse(value: str) -> tuple[int, int]:
    """``K/N`` (1 <= K <= N) as (K, N)."""
    try:
        k, n = (int(part) for part in value.split("/"))
    except ValueError:
        raise pytest.UsageError(f"--shard takes K/N, like 1/2; got {value!r}") from None
    if not 1 <= k <= n:
        raise pytest.UsageError(f"--shard K/N needs 1 <= K <= N; got {value!r}")
    return k, n


def module_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def groups(items: Sequence[pytest.Item]) -> list[list[str]]:
    """The modules of ``items``, those sharing a fixture of ``SHARED`` in one group."""
    parent: dict[str, str] = {}

    def root(name: str) -> str:
        while parent.setdefault(name, name) != name:
            name = parent[name]
        return name

    for item in items:
        module = root(module_of(item))
        for fixture in set(SHARED) & set(getattr(item, "fixturenames", ())):
            parent[root(f"fixture:{defined_at(item, fixture)}")] = module
    out: dict[str, list[str]] = defaultdict(list)
    for name in list(parent):
        if not name.startswith("fixture:"):
            out[root(name)].append(name)
    return list(out.values())


def defined_at(item: pytest.Item, fixture: str) -> str:
    """Where the fixture ``item`` gets under that name is defined: a module's own fixture of the
    same name is another one."""
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {}).get(fixture)
    return f"{defs[-1].func.__module__}.{defs[-1].func.__qualname__}" if defs else fixture


def weights(items: Sequence[pytest.Item], times: dict[str, list[float]]) -> dict[str, float]:
    """Each module's expected seconds: its recorded seconds per test times the tests selected
    (a module not recorded yet: the median seconds per test of those recorded)."""
    per_test = {m: seconds / max(count, 1) for m, (seconds, count) in times.items()}
    default = statistics.median(per_test.values()) if per_test else 1.0
    counts: dict[str, int] = defaultdict(int)
    for item in items:
        counts[module_of(item)] += 1
    return {m: per_test.get(m, default) * c for m, c in counts.items()}


def assign(items: Sequence[pytest.Item], n: int, times: dict[str, list[float]]) -> list[set[str]]:
    """The modules of each of ``n`` shards."""
    w = weights(items, times)
    load = [0.0] * n
    shards: list[set[str]] = [set() for _ in range(n)]
    for group in sorted(groups(items), key=lambda g: (-sum(w[m] for m in g), sorted(g))):
        lightest = min(range(n), key=lambda i: (load[i], i))
        shards[lightest].update(group)
        load[lightest] += sum(w[m] for m in group)
    return shards


def select(config: pytest.Config, items: list[pytest.Item], shard: tuple[int, int]) -> None:
    """Keep in ``items`` the tests of ``shard``; report the others deselected."""
    k, n = shard
    mine = assign(items, n, load_times())[k - 1]
    deselected = [item for item in items if module_of(item) not in mine]
    items[:] = [item for item in items if module_of(item) in mine]
    if deselected:
        config.hook.pytest_deselected(items=deselected)


def load_times() -> dict[str, list[float]]:
    return json.loads(TIMES.read_text()) if TIMES.exists() else {}


def record(reports: Iterable[Path]) -> dict[str, list[float]]:
    """Seconds and tests per module, summed over the testcases of JUnit XML ``reports``."""
    times: dict[str, list[float]] = {}
    for report in reports:
        for case in ET.parse(report).iter("testcase"):
            module = case.get("classname", "").split(".")
            path = next((i for i in range(len(module), 0, -1) if module[i - 1].startswith("test_")), 0)
            name = "/".join(module[:path]) + ".py"
            seconds, count = times.setdefault(name, [0.0, 0])
            times[name] = [round(seconds + float(case.get("time", 0)), 2), count + 1]
    return dict(sorted(times.items()))


if __name__ == "__main__":
    recorded = record(Path(p) for p in sys.argv[1:])
    TIMES.write_text(json.dumps(recorded, indent=0) + "\n")
    print(f"{TIMES}: {len(recorded)} modules, {sum(s for s, _ in recorded.values()):.0f} s")
