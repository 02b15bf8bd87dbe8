"""Shared fixtures: one real broker for the test session, started with our own command."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

import pytest
from hypothesis import settings as hypothesis_settings
from hypothesis.database import DirectoryBasedExampleDatabase

from federator.broker import TANSU_NODE_FLAGS, die_with_parent
from tests import shards

if TYPE_CHECKING:
    from tests.apache_kafka import KafkaCluster

# Hypothesis, for every test in the suite (a test's own @settings only adds example counts).
# "federator" (the default): derandomized, so the examples are a function of the test's code:
# a failure one run finds, every run finds, on any machine and from a clean clone, where an
# example database would replay it only on the machine that saw it (.hypothesis/ is not
# committed); and no deadline: how long an example takes is for tests/bench, not an assert.
# HYPOTHESIS_PROFILE=explore draws new examples each run and keeps failing ones in
# .hypothesis/examples at the repo root (ignored by git), where the next run replays them.
hypothesis_settings.register_profile("federator", derandomize=True, deadline=None, print_blob=True)
hypothesis_settings.register_profile(
    "explore", derandomize=False, deadline=None, print_blob=True,
    database=DirectoryBasedExampleDatabase(str(Path(__file__).resolve().parents[1] / ".hypothesis" / "examples")),
)
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "federator"))


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_PORTS = range(max(1024, _ephemeral_low() - 12_000), _ephemeral_low())  # a shard takes its slice
_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A loopback port free now, for a server a test starts later. Taken below the kernel's
    ephemeral range, where ports bound to 0 come from (a node's key port, every client
    connection): one of those took a port handed out here before its server bound it, and the
    server failed with 'Address already in use'. Never handed out twice in one run."""
    rnd = random.Random()
    for _ in range(2000):
        port = rnd.choice(_PORTS)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError(f"no free port in {_PORTS.start}-{_PORTS.stop - 1}")


def stop_process(proc: subprocess.Popen, grace: float, sig: int = signal.SIGTERM) -> int:
    """Send ``sig`` to a running process, give it ``grace`` seconds to end, then SIGKILL; its exit code."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            return proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


def federator_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "federator.cli", *args]


def dies_with_tests(sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A ``preexec_fn`` for a test's child process: Linux sends it ``sig`` when the test run dies,
    even by SIGKILL, so no node or broker outlives a killed pytest. Only for children started
    from the main thread: the signal fires when the starting thread ends, and a helper
    thread (a test's restart loop) ends long before the run does; those are stopped by the
    test that started them."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return die_with_parent(sig)


# The tansu brokers this run started: nodes on them get the flags that suit tansu (broker_flags).
TANSU_BOOTSTRAPS: set[str] = set()
# Where each of them writes its log (tansu's warnings and errors, unless $RUST_LOG says more).
TANSU_LOGS: dict[str, Path] = {}


def broker_log_tail(bootstrap_servers: str, lines: int = 30) -> str:
    """The path and last lines of the log of the tansu broker at ``bootstrap_servers``, for a
    failure's message; "" for another broker."""
    log = TANSU_LOGS.get(bootstrap_servers)
    if log is None:
        return ""
    tail = log.read_text(errors="replace").splitlines()[-lines:] if log.exists() else []
    return "\n".join([f"tansu's log: {log}", *tail])


def broker_flags(bootstrap_servers: str) -> list[str]:
    """The flags for a node on ``bootstrap_servers`` that suit its broker: tansu's, or the
    node's defaults (which suit Apache Kafka)."""
    return list(TANSU_NODE_FLAGS) if bootstrap_servers in TANSU_BOOTSTRAPS else []


class RunningBroker:
    def __init__(self, port: int, log: Path | None = None) -> None:
        """``log``: the file for the broker's output (default: a new one under the temp dir)."""
        self.port = port
        self.bootstrap_servers = f"127.0.0.1:{port}"
        self.log = log or Path(tempfile.mkdtemp(prefix="tansu-")) / "broker.log"
        TANSU_BOOTSTRAPS.add(self.bootstrap_servers)
        TANSU_LOGS[self.bootstrap_servers] = self.log
        with self.log.open("w") as out:  # a file, not a pipe nobody reads: a full pipe stops tansu
            self.proc = subprocess.Popen(
                federator_cmd("broker", "--port", str(port)),
                stdout=subprocess.PIPE, stderr=out, text=True,
                env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")},
                preexec_fn=dies_with_tests(signal.SIGTERM),  # it stops its tansu child on SIGTERM
            )
        assert self.proc.stdout is not None
        self.ready_line = self.proc.stdout.readline()  # our stdout carries only this line
        if "ready" not in self.ready_line:
            self.proc.kill()
            raise RuntimeError(f"`federator broker` did not start; it printed {self.ready_line!r}")

    def stop(self, sig: int = signal.SIGTERM) -> int:
        return stop_process(self.proc, 15, sig)


@pytest.fixture(scope="session")
def tansu_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBroker]:
    """A tansu broker on a free port, started by `federator broker`, for the whole session."""
    b = RunningBroker(free_port(), tmp_path_factory.mktemp("tansu") / "broker.log")
    yield b
    b.stop()


@pytest.fixture(scope="session")
def apache_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator["KafkaCluster"]:
    """One Apache Kafka broker (KRaft, Kafka's default settings) for the whole session."""
    from tests.apache_kafka import KafkaCluster

    cluster = KafkaCluster(tmp_path_factory.mktemp("apache-kafka"), brokers=1).start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def apache_kafka3(tmp_path_factory: pytest.TempPathFactory) -> Iterator["KafkaCluster"]:
    """Three Apache Kafka brokers, topics replicated three times (min.insync.replicas 2), for
    the tests that stop and start brokers: each test leaves every broker running."""
    from tests.apache_kafka import KafkaCluster

    cluster = KafkaCluster(tmp_path_factory.mktemp("apache-kafka3"), brokers=3).start()
    yield cluster
    cluster.stop()


# The `broker` fixture is tansu, or for tests marked `apache_kafka` each of tansu and Apache
# Kafka in turn. FEDERATOR_APACHE_KAFKA=only (`make test-kafka`) runs the marked tests on
# Apache Kafka alone, the long ones (`apache_kafka(long=True)`) included; by default those run
# on tansu only, to keep `make test` short.
BROKER_FIXTURES = {"tansu": "tansu_broker", "kafka": "apache_kafka"}


def broker_kinds(marker: pytest.Mark | None) -> list[str]:
    if marker is None:
        return ["tansu"]
    if os.environ.get("FEDERATOR_APACHE_KAFKA") == "only":
        return ["kafka"]
    return ["tansu"] if marker.kwargs.get("long") else ["tansu", "kafka"]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # Every test on `broker` is parametrized, the tansu-only ones too: a session fixture built on
    # it (the Spark tests' world) is then one instance per broker, shared by marked and unmarked
    # tests alike, and pytest runs the tests of one broker together.
    if "broker" in metafunc.fixturenames:
        kinds = broker_kinds(metafunc.definition.get_closest_marker("apache_kafka"))
        metafunc.parametrize("broker", kinds, indirect=True, scope="session")


# Fixtures that a run of consecutive tests shares and that stop when the next test does not use
# them (tests/integration/bi_cluster.py): their users run one after the other, those that also use
# the fixture named beside it last (the fuzzer's stores stay in the shared cluster's catalog,
# where the tests that list the stores would see them).
RUN_TOGETHER = {"bi_cluster": "fuzz_db"}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--shard", metavar="K/N", type=shards.parse,
                     help="run the K-th of N disjoint sets of test modules (tests/shards.py; make test runs them side by side)")


def pytest_configure(config: pytest.Config) -> None:
    global _PORTS
    if shard := config.getoption("shard"):  # the shards run at once: they must not hand out the same port
        k, n = shard
        size = len(_PORTS) // n
        _PORTS = range(_PORTS.start + (k - 1) * size, _PORTS.start + k * size)


@pytest.hookimpl(trylast=True)  # after pytest has ordered the tests by the session's broker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if shard := config.getoption("shard"):
        shards.select(config, items, shard)
    for fixture, last in RUN_TOGETHER.items():
        items[:] = run_together(items, fixture, last)


def run_together(items: list[pytest.Item], fixture: str, last: str) -> list[pytest.Item]:
    """``items`` with every user of ``fixture`` on one broker moved up beside the first one (users
    of ``last`` at the end), the order otherwise kept: each separate run of them started the
    shared cluster anew."""
    def uses(item: pytest.Item, name: str) -> bool:
        return name in getattr(item, "fixturenames", ())

    def broker_of(item: pytest.Item) -> object:
        return getattr(item, "callspec", None) and item.callspec.params.get("broker")

    users: dict[object, list[pytest.Item]] = {}
    for item in items:
        if uses(item, fixture):
            users.setdefault(broker_of(item), []).append(item)
    out: list[pytest.Item] = []
    for item in items:
        if not uses(item, fixture):
            out.append(item)
        elif users[broker_of(item)][0] is item:
            out.extend(sorted(users[broker_of(item)], key=lambda i: uses(i, last)))  # a stable sort
    return out


@pytest.fixture(scope="session")
def broker(request: pytest.FixtureRequest):
    """The session's broker, tansu or Apache Kafka (above); either has ``bootstrap_servers``."""
    return request.getfixturevalue(BROKER_FIXTURES[request.param])


@pytest.fixture
def app_id() -> str:
    """A fresh application id, so tests never see each other's topics."""
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture(autouse=True)
def _quiet_kafka_debug(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FEDERATOR_KAFKA_DEBUG", raising=False)


os.environ.setdefault("PYTHONUNBUFFERED", "1")
