"""Benchmark plumbing: a report that the bench tests fill in, printed and written to results.md.

Benchmarks never assert on timings; they measure, compare with a baseline measured in the
same run, and say where each target stands. Run them with ``make bench``.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import sys
from pathlib import Path
from typing import Iterator

import pytest

RESULTS_MD = Path(__file__).with_name("results.md")


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
        cpu = os.cpu_count()
        out = [
            "# Federator benchmarks",
            "",
            f"Run {dt.datetime.now():%Y-%m-%d %H:%M}, Python {platform.python_version()} on {platform.machine()}, "
            f"{cpu} cores. Load generator, broker and nodes all share this machine.",
            "",
        ]
        if self.targets:
            out += ["## Targets (reported, never asserted)", "", "| target | measured | |", "|---|---|---|"]
            out += [f"| {t} | {m} | {v} |" for t, m, v in self.targets]
            out.append("")
        for title, lines in self.sections:
            out += [f"## {title}", "", *lines, ""]
        if self.notes:
            out += ["## Notes", "", *(f"- {n}" for n in self.notes), ""]
        return "\n".join(out)


@pytest.fixture(scope="session")
def report() -> Iterator[Report]:
    rep = Report()
    yield rep
    text = rep.render()
    RESULTS_MD.write_text(text)
    sys.stdout.write("\n" + text + f"\n(written to {RESULTS_MD})\n")
    sys.stdout.flush()
