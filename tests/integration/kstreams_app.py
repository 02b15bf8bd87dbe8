"""The tests' Kafka Streams application (the Maven project in tests/integration/kstreams/): built
once per machine into a cache, run as a subprocess, and asked for its own interactive queries.

`make kstreams` (which `make test` depends on) runs ``python -m tests.integration.kstreams_app``
to build it, showing Maven's progress; a test session that finds no build makes it the same
way. Maven fetches kafka-streams and its dependencies from Maven Central the first time, and
works offline after that.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from tests.conftest import dies_with_tests, stop_process

PROJECT = Path(__file__).resolve().parent / "kstreams"
MAIN = "federator.kstreams.GameApp"
# A small heap and the client compiler: the application starts in seconds beside the broker and the nodes.
JVM_OPTS = ["-Xms64m", "-Xmx384m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-XX:-UsePerfData"]
INSTALL = ("the Kafka Streams tests need a JDK 17 and Maven: install Debian's openjdk-17-jdk-headless and "
           "maven packages (apt-get install openjdk-17-jdk-headless maven), then run `make kstreams`")


def _sources() -> list[Path]:
    return [PROJECT / "pom.xml", *sorted((PROJECT / "src").rglob("*.*"))]


def build_dir() -> Path:
    """Where the build lives: keyed by the project's files, so a change builds again."""
    digest = hashlib.sha256()
    for f in _sources():
        digest.update(str(f.relative_to(PROJECT)).encode() + b"\0" + f.read_bytes())
    root = Path(os.environ.get("FEDERATOR_CACHE") or Path.home() / ".cache" / "federator")
    return root / f"kstreams-game-{digest.hexdigest()[:12]}"


def built(progress: bool = False) -> Path:
    """The build directory (the application's jar, and its dependencies under lib/), built with
    Maven the first time on this machine."""
    out = build_dir()
    if (out / ".complete").exists():
        return out
    missing = [tool for tool in ("java", "javac", "mvn") if shutil.which(tool) is None]
    if missing:
        raise RuntimeError(f"{' and '.join(missing)} not found: {INSTALL}")
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session or worktree may be building it too
        if not (out / ".complete").exists():
            _build(out, progress)
    return out


def _build(out: Path, progress: bool) -> None:
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f"{out.name}-"))
    cmd = ["mvn", "-B", "-f", str(PROJECT / "pom.xml"), "package", f"-Dout.dir={tmp}"]
    if not progress:
        cmd.insert(1, "-q")
    done = subprocess.run(cmd, stdout=None if progress else subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RuntimeError(f"building the Kafka Streams application with Maven failed (exit {done.returncode}):\n"
                           f"{(done.stdout or '')[-4000:]}")
    (tmp / ".complete").touch()
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


class StreamsApp:
    """The game's Kafka Streams application, running: ``query`` asks its oracle (IQv2 over HTTP)."""

    def __init__(self, bootstrap: str, application_id: str, state_dir: Path, port: int,
                 results_topic: str, levels_topic: str) -> None:
        self.application_id, self.port = application_id, port
        self.log = state_dir.parent / f"{application_id}.log"
        state_dir.mkdir(parents=True, exist_ok=True)
        out = built()
        self.proc = subprocess.Popen(
            ["java", *JVM_OPTS, "-cp", f"{out}/*:{out}/lib/*", MAIN, bootstrap, application_id, str(state_dir),
             str(port), results_topic, levels_topic],
            stdout=open(self.log, "a"), stderr=subprocess.STDOUT, preexec_fn=dies_with_tests())

    def changelog(self, store: str) -> str:
        """The changelog topic Kafka Streams names for one of the application's stores."""
        return f"{self.application_id}-{store}-changelog"

    def query(self, path: str, **params: Any) -> dict:
        """GET one of the oracle's answers (see Oracle.java): {"rows": [...], "position": {...}}."""
        if self.proc.poll() is not None:
            raise RuntimeError(f"the Kafka Streams application exited ({self.proc.returncode}); "
                               f"its log:\n{self.log.read_text()[-3000:]}")
        query = urllib.parse.urlencode(params, doseq=True)
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/{path}?{query}", timeout=30) as resp:
            return json.loads(resp.read())

    def state(self) -> str | None:
        try:
            return self.query("status")["state"]
        except OSError:
            return None

    def stop(self) -> int:
        return stop_process(self.proc, 30)


if __name__ == "__main__":
    # `make kstreams`: build the application once per machine, showing Maven's progress
    if not (build_dir() / ".complete").exists():
        print(f"==> building the tests' Kafka Streams application with Maven into {build_dir()} (once per machine)",
              flush=True)
    print(f"the Kafka Streams application: {built(progress=True)}")
