"""What the tests build or fetch once per machine (with Maven: Apache Kafka's jars, the Kafka
Streams application; Superset's environment; a wheel of the repository): into a cache directory keyed by the inputs, under
a lock, complete or absent."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable, Iterator

INSTALL = ("install a JDK 17 and Maven (Debian: apt-get install openjdk-17-jdk-headless maven), "
           "then run `make test` again")


def cache_dir(name: str, inputs: Iterable[Path], base: Path | None = None) -> Path:
    """``name``-HASH under the cache root (FEDERATOR_CACHE, else ~/.cache/federator): the hash is
    of the ``inputs`` files (their paths relative to ``base``, and contents), so a change makes anew."""
    root = Path(os.environ.get("FEDERATOR_CACHE") or Path.home() / ".cache" / "federator")
    return root / f"{name}-{files_digest(inputs, base)[:12]}"


def files_digest(inputs: Iterable[Path], base: Path | None = None) -> str:
    """SHA-256 of the ``inputs`` files' contents (and their paths relative to ``base`` when given)."""
    digest = hashlib.sha256()
    for f in inputs:
        if base is not None:
            digest.update(str(f.relative_to(base)).encode() + b"\0")
        digest.update(f.read_bytes())
    return digest.hexdigest()


def maven_once(out: Path, maven_args: Callable[[Path], list[str]], what: str, progress: bool = False,
               tools: tuple[str, ...] = ("java", "mvn")) -> Path:
    """``out``, made by ``mvn -B *maven_args(tmp)`` (see ``build_once``); ``what`` names it in errors."""
    if (out / ".complete").exists():
        return out
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        raise RuntimeError(f"{what} needs {' and '.join(missing)}, not found: {INSTALL}")
    return build_once(out, lambda tmp: _run_maven(tmp, maven_args, what, progress))


def build_once(out: Path, build: Callable[[Path], None]) -> Path:
    """``out``, made by ``build(tmp)`` into a temporary directory renamed to ``out`` when it
    returns, unless a complete ``out`` exists; a ``build`` that raises leaves nothing."""
    if (out / ".complete").exists():
        return out
    with locked(out):  # another session or worktree may be making it too
        if not (out / ".complete").exists():
            tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f"{out.name}-"))
            try:
                build(tmp)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            (tmp / ".complete").touch()
            shutil.rmtree(out, ignore_errors=True)
            tmp.rename(out)
    return out


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (a ``.NAME.lock`` file beside it, NAME without a leading
    dot) for the block: one process at a time makes or changes it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name.lstrip('.')}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _run_maven(tmp: Path, maven_args: Callable[[Path], list[str]], what: str, progress: bool) -> None:
    cmd = ["mvn", "-B", *(() if progress else ("-q",)), *maven_args(tmp)]
    done = subprocess.run(cmd, stdout=None if progress else subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{what} with Maven failed (exit {done.returncode}):\n{(done.stdout or '')[-4000:]}")
