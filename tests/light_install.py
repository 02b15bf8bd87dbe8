"""A wheel of the repository and venvs that install it, for the tests and the benchmark of the
client alone (`pip install federator`, no extras).

The wheel is built once per content of the files that go into it (cached under ~/.cache/federator);
a venv is kept between runs (in the repository's ignored ``.venv-*`` folders) and made anew when
what it installs changes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Sequence

from tests.maven_cache import build_once, cache_dir, locked

ROOT = Path(__file__).resolve().parents[1]
# what setup.py packs: the packages, their metadata and the long description
SOURCES = ("federator", "spark", "plugins", "setup.cfg", "setup.py", "pyproject.toml", "README.md")
PIP_QUIET = ("--quiet", "--disable-pip-version-check", "--progress-bar", "off")


def _source_files() -> list[Path]:
    files = []
    for name in SOURCES:
        path = ROOT / name
        found = sorted(path.rglob("*")) if path.is_dir() else [path]
        files += [f for f in found if f.is_file() and "__pycache__" not in f.parts and f.suffix != ".pyc"]
    return files


def wheel() -> Path:
    """The repository's wheel (federator-VERSION-py3-none-any.whl), built when its sources changed."""
    def build(tmp: Path) -> None:
        src = tmp / "src"
        for f in _source_files():
            (src / f.relative_to(ROOT)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, src / f.relative_to(ROOT))
        subprocess.run([sys.executable, "-m", "pip", "wheel", *PIP_QUIET, "--no-deps", "-w", str(tmp), str(src)],
                       check=True, timeout=300)
        shutil.rmtree(src)

    out = build_once(cache_dir("wheel", _source_files(), base=ROOT), build)
    (found,) = out.glob("federator-*.whl")
    return found


def new_venv(path: Path, requirements: Sequence[str]) -> Path:
    """A fresh venv at ``path`` with ``requirements`` installed; its Python."""
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(path)], check=True, timeout=300)
    python = path / "bin" / "python"
    if requirements:
        subprocess.run([str(python), "-m", "pip", "install", *PIP_QUIET, *requirements], check=True, timeout=900)
    return python


def cached_venv(path: Path, requirements: Sequence[str], key: str | None = None) -> Path:
    """The Python of a venv at ``path`` with ``requirements``, kept while ``key`` (default: the
    requirements) stays the same."""
    marker = path / ".installed"
    wanted = key if key is not None else json.dumps(list(requirements))
    with locked(path):  # the shards of a run may want it at once
        if marker.exists() and marker.read_text() == wanted:
            return path / "bin" / "python"
        python = new_venv(path, requirements)
        marker.write_text(wanted)
    return python


def requires_dist(whl: Path) -> list[str]:
    """The wheel's declared dependencies (its METADATA's Requires-Dist lines)."""
    with zipfile.ZipFile(whl) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        return [line for line in z.read(name).decode().splitlines() if line.startswith("Requires-Dist:")]


def light_venv(name: str, pins: Sequence[str]) -> Path:
    """The Python of ``.venv-light-NAME``: the wheel without extras, beside ``pins``. Made anew when
    the pins or the wheel's dependencies change; a changed wheel alone is installed over the old."""
    whl, venv = wheel(), ROOT / f".venv-light-{name}"
    python = cached_venv(venv, [str(whl), *pins], key=json.dumps([list(pins), requires_dist(whl)]))
    installed = venv / ".wheel"
    if not installed.exists() or installed.read_text() != str(whl):
        subprocess.run([str(python), "-m", "pip", "install", *PIP_QUIET, "--no-deps", "--force-reinstall", str(whl)],
                       check=True, timeout=300)
        installed.write_text(str(whl))
    return python


def site_packages_bytes(venv: Path) -> int:
    """Bytes of the files a venv's site-packages holds."""
    (site,) = (venv / "lib").glob("python3*/site-packages")
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(site) for f in fs)
