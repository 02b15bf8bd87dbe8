"""setup.cfg's ``bench`` extra: what `make bench` installs into .venv-faust for the Faust benchmark.

Faust is a baseline the benchmarks run beside Federator, never a dependency of the package:
it is in the ``bench`` extra only, pinned exactly (the baseline must not move between runs),
and tests/bench/bench_requirements.py, which the Makefile asks, reads it without comments.
"""

from __future__ import annotations

import configparser

from tests.bench.bench_requirements import SETUP_CFG, bench_requirements


def test_bench_extra_is_an_exact_faust_pin_and_nothing_else_needs_faust() -> None:
    (faust,) = bench_requirements()
    name, _, version = faust.partition("==")
    assert name == "faust-streaming" and version and not set(version) & set("<>=!~*, "), faust
    cfg = configparser.ConfigParser()
    cfg.read(SETUP_CFG)
    extras = cfg["options.extras_require"]
    others = [cfg["options"]["install_requires"], *(extras[name] for name in extras if name != "bench")]
    assert not any("faust" in text.lower() for text in others)
