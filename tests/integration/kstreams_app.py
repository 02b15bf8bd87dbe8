"""The tests' Kafka Streams application (the Maven project in tests/integration/kstreams/): built
once per machine into a cache, run as a subprocess, and asked for its own interactive queries.

`make kstreams` (which `make test` depends on) runs ``python -m tests.integration.kstreams_app``
to build it, showing Maven's progress; a test session that finds no build makes it the same
way. Maven fetches kafka-streams and its dependencies from Maven Central the first time, and
works offline after that.
"""

from __future__ import annotations

import json
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from tests import maven_cache
from tests.conftest import dies_with_tests, stop_process

PROJECT = Path(__file__).resolve().parent / "kstreams"
MAIN = "federator.kstreams.GameApp"
# A small heap and the client compiler: the application starts in seconds beside the broker and the nodes.
JVM_OPTS = ["-Xms64m", "-Xmx384m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-XX:-UsePerfData"]


def build_dir() -> Path:
    """Where the build lives: keyed by the project's files, so a change builds again."""
    return maven_cache.cache_dir("kstreams-game", [PROJECT / "pom.xml", *sorted((PROJECT / "src").rglob("*.*"))],
                                 base=PROJECT)


def built(progress: bool = False) -> Path:
    """The build directory (the application's jar, and its dependencies under lib/), built with
    Maven the first time on this machine."""
    return maven_cache.maven_once(build_dir(), lambda tmp: ["-f", str(PROJECT / "pom.xml"), "package", f"-Dout.dir={tmp}"],
                                  "building the Kafka Streams test application", progress, tools=("java", "javac", "mvn"))


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
