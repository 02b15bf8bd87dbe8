"""Print setup.cfg's ``bench`` extra, one requirement a line, for `make bench` to install into .venv-faust.

The extra holds what the benchmarks run beside Federator (faust-streaming), kept out of
.venv so its pins never change what Federator runs with. Standard library only: it runs
with the Python that builds the venvs, before either exists.
"""

from __future__ import annotations

import configparser
import sys
from pathlib import Path

SETUP_CFG = Path(__file__).resolve().parents[2] / "setup.cfg"


def bench_requirements(path: Path = SETUP_CFG) -> list[str]:
    cfg = configparser.ConfigParser()
    cfg.read(path)
    lines = (line.split("#", 1)[0].strip() for line in cfg["options.extras_require"]["bench"].splitlines())
    return [line for line in lines if line]


if __name__ == "__main__":
    sys.stdout.write("".join(r + "\n" for r in bench_requirements()))
