"""What `pip install` costs: the client alone (`pip install federator`, no extras) beside a node
(`federator[node]`) and everything (`federator[node,spark,broker]`, what `pip install federator`
installed before the node, the Spark side and the development broker became extras).

Each install goes into a fresh venv from the repository's wheel (tests/light_install.py), twice:
the first fills pip's cache, the second is timed, so the figure is pip's own work (resolving,
unpacking, compiling) and not the network. Size: the bytes the install adds to an empty venv's
site-packages. Nothing is asserted; the figures go to results.md and docs/how-to/python-clients.md.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from tests.bench.conftest import Report, progress
from tests.light_install import PIP_QUIET, new_venv, site_packages_bytes, wheel

INSTALLS = [
    ("client alone: `pip install federator`", ""),
    ("client and SQLAlchemy: `federator[sqlalchemy]`", "[sqlalchemy]"),
    ("a node: `federator[node]`", "[node]"),
    ("everything: `federator[node,spark,broker]` (the former `pip install federator`)", "[node,spark,broker]"),
]


def _timed_install(venv: Path, requirement: str) -> tuple[float, int, int]:
    """Seconds `pip install requirement` took in a fresh venv, the bytes it added, the distributions it added."""
    python = new_venv(venv, [])
    empty, before = site_packages_bytes(venv), _distributions(python)
    start = time.perf_counter()
    subprocess.run([str(python), "-m", "pip", "install", *PIP_QUIET, requirement], check=True, timeout=1800)
    took = time.perf_counter() - start
    return took, site_packages_bytes(venv) - empty, _distributions(python) - before


def _distributions(python: Path) -> int:
    listed = subprocess.run([str(python), "-m", "pip", "list", "--format", "freeze", "--disable-pip-version-check"],
                            capture_output=True, text=True, check=True, timeout=120).stdout
    return len(listed.split())


def test_install_size_and_time(report: Report, tmp_path: Path) -> None:
    whl = wheel()
    load_before = os.getloadavg()[0]
    rows = []
    for what, extras in INSTALLS:
        progress(f"pip install {whl.name}{extras}")
        _timed_install(tmp_path / "warm", f"{whl}{extras}")  # fills pip's cache
        took, size, count = _timed_install(tmp_path / "measured", f"{whl}{extras}")
        rows.append((what, took, size, count))
    base_took, base_size = rows[0][1], rows[0][2]
    full_took, full_size = rows[-1][1], rows[-1][2]
    lines = ["| install | time, warm pip cache | added to site-packages | distributions |", "|---|---:|---:|---:|"]
    lines += [f"| {what} | {took:.1f} s | {size / 2**20:,.0f} MiB | {count} |" for what, took, size, count in rows]
    report.section("pip install: the client alone beside a node and everything", lines + [
        "", f"The client alone is {base_size / full_size:.1%} of everything's size and takes "
            f"{base_took / full_took:.0%} of its install time. Load average (1 min) at the start and the end: "
            f"{load_before:.1f}, {os.getloadavg()[0]:.1f} (pip's times grow with it)."])
