"""Benchmark plumbing: a report that the bench tests fill in, printed and appended to results.md.

Benchmarks never assert on timings; they measure, compare with a baseline measured in the
same run, and say where each target stands. Run them with ``make bench``. Each session
appends one dated section (date, commit, machine) to results.md, so earlier runs stay.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import pytest

if TYPE_CHECKING:
    from tests.apache_kafka import KafkaCluster

# FEDERATOR_BENCH_RESULTS: append elsewhere (a quick look at small sizes need not enter the history)
# the nodes' HTTP server (`federator node --server`) in the benches that start nodes; None: their default
SERVER = os.environ.get("FEDERATOR_BENCH_SERVER") or None
RESULTS_MD = Path(os.environ.get("FEDERATOR_BENCH_RESULTS") or Path(__file__).with_name("results.md"))


def progress(msg: str) -> None:
    print(f"[bench {dt.datetime.now():%H:%M:%S}] {msg}", flush=True)


class Report:
    def __init__(self) -> None:
        self.sections: list[tuple[str, list[str]]] = []
        self.targets: list[tuple[str, str, str]] = []  # (target, measured, verdict)
        self.notes: list[str] = []

    def section(self, title: str, lines: list[str]) -> None:
        self.sections.append((title, lines))

    def target(self, name: str, measured: str, met: bool | None) -> None:
        verdict = "n/a" if met is None else ("MET" if met else "MISSED")
        self.targets.append((name, measured, verdict))

    def render(self) -> str:
        """The whole report as a document of its own (level-1 title, level-2 sections)."""
        cpu = os.cpu_count()
        out = [
            "# Federator benchmarks",
            "",
            f"Run {dt.datetime.now():%Y-%m-%d %H:%M}, Python {platform.python_version()} on {platform.machine()}, "
            f"{cpu} cores. Load generator, broker and nodes all share this machine.",
            "",
        ]
        return "\n".join(out + self._body("##"))

    def render_run(self) -> str:
        """This run as one dated section of results.md: when, which commit, which machine."""
        out = [f"## Run {dt.datetime.now():%Y-%m-%d %H:%M} ({dt.datetime.now().astimezone():%Z}), commit {_commit()}", "",
               f"{_machine()}. Load generator, broker and nodes all share this machine.", ""]
        return "\n".join(out + self._body("###"))

    def _body(self, level: str) -> list[str]:
        out: list[str] = []
        if self.targets:
            out += [f"{level} Targets (reported, never asserted)", "", "| target | measured | |", "|---|---|---|"]
            out += [f"| {t} | {m} | {v} |" for t, m, v in self.targets]
            out.append("")
        for title, lines in self.sections:
            out += [f"{level} {title}", "", *lines, ""]
        if self.notes:
            out += [f"{level} Notes", "", *(f"- {n}" for n in self.notes), ""]
        return out


def _commit() -> str:
    """HEAD's short hash, and whether tracked files differed from it (the nodes run the working tree)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=Path(__file__).parent,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head or 'unknown'}" + (" (working tree with uncommitted changes to tracked files)" if dirty else "")


def _machine() -> str:
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
        with open("/proc/meminfo") as f:
            mem_kb = next(int(line.split()[1]) for line in f if line.startswith("MemTotal"))
        memory = f", {mem_kb / 2**20:.0f} GB RAM"
    except (OSError, StopIteration, ValueError):
        memory = ""
    cpu = f"{os.cpu_count()} cores" + (f" ({model})" if model else "")
    return f"Python {platform.python_version()} on {platform.machine()} {platform.system()}, {cpu}{memory}"


def append_results(text: str, path: Path = RESULTS_MD) -> None:
    """Add one run's section at the end of ``path``, keeping the runs before it."""
    before = path.read_text() if path.exists() else ""
    if not before.strip():
        before = ("# Federator benchmarks\n\nEach `make bench` session (or part of one) appends its run below, "
                  "newest last; compare a figure with the baseline measured in the same run.\n")
    with path.open("w") as f:
        f.write(before.rstrip("\n") + "\n\n" + text.rstrip("\n") + "\n")


@pytest.fixture(scope="session")
def report() -> Iterator[Report]:
    rep = Report()
    yield rep
    if not (rep.targets or rep.sections or rep.notes):
        return  # nothing measured (every test skipped or failed early): no empty run in the history
    text = rep.render_run()
    append_results(text)
    sys.stdout.write("\n" + text + f"\n(appended to {RESULTS_MD})\n")
    sys.stdout.flush()


@pytest.fixture(scope="session")
def apache_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator["KafkaCluster"]:
    """The benches' Apache Kafka: one broker run as kafka-server-start.sh runs it, so that the
    cores it takes beside the nodes are those of a broker in service, not of one started for a
    quick test."""
    from tests.apache_kafka import SERVER_START_JVM_OPTS, KafkaCluster

    cluster = KafkaCluster(tmp_path_factory.mktemp("apache-kafka"), brokers=1, jvm=SERVER_START_JVM_OPTS).start()
    yield cluster
    cluster.stop()
