"""Apache Kafka for the tests: the broker's jars from Maven Central, cached once per machine, and
KRaft clusters (each node a combined broker and controller) started on loopback.

`make kafka` (which `make test` depends on) runs ``python -m tests.apache_kafka`` to fetch the
jars; a test session that finds them missing fetches them the same way. The brokers keep
Apache Kafka's default settings for groups (``group.min.session.timeout.ms`` 6000 and the
rest), so what the tests see is what a user's cluster does.
"""

from __future__ import annotations

import base64
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka.admin import AdminClient

from federator import kafka
from tests import maven_cache
from tests.conftest import dies_with_tests, free_port, stop_process

POM = Path(__file__).resolve().parent / "maven" / "kafka-pom.xml"
# A small heap, the serial collector and the client compiler: a broker up in seconds on a
# small machine, several of them beside the test nodes.
JVM_OPTS = ["-Xms64m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-XX:-UsePerfData",
            "-Xshare:auto", "-Djava.awt.headless=true", "-Djava.net.preferIPv4Stack=true"]
# As Kafka's kafka-server-start.sh runs a broker (its heap, KAFKA_JVM_PERFORMANCE_OPTS): slower to
# start, but the server compiler's code once warm, as a production broker takes its load.
SERVER_START_JVM_OPTS = ["-Xmx1G", "-Xms1G", "-server", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
                         "-XX:InitiatingHeapOccupancyPercent=35", "-XX:+ExplicitGCInvokesConcurrent",
                         "-XX:MaxInlineLevel=15", "-Djava.awt.headless=true", "-Djava.net.preferIPv4Stack=true"]
LOG4J2 = """\
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.out.ref = out
logger.server.name = kafka.server
logger.server.level = INFO
"""


def cache_dir() -> Path:
    """Where the jars live: keyed by the pom's contents, so a version change fetches again."""
    return maven_cache.cache_dir("apache-kafka", [POM])


def kafka_libs(progress: bool = False) -> Path:
    """The directory of the broker's jars, fetched with Maven (from Maven Central, through the
    local ~/.m2 repository) the first time on this machine."""
    return maven_cache.maven_once(
        cache_dir() / "libs", lambda tmp: ["-f", str(POM), "dependency:copy-dependencies", "-DincludeScope=runtime",
                                           f"-DoutputDirectory={tmp}"],
        "fetching Apache Kafka", progress, tools=("mvn",))


def java(libs: Path, main: str, *args: str, jvm: list[str] | None = None) -> list[str]:
    return ["java", *(jvm or JVM_OPTS), "-cp", f"{libs}/*", main, *args]


def random_cluster_id() -> str:
    """A KRaft cluster id: a UUID in URL-safe base64 without padding, as `kafka-storage random-uuid` prints.
    Like Kafka's Uuid.randomUuid, never one that starts with '-' (the storage tool's argument
    parser takes it for a flag, one id in 64)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id


@dataclass
class KafkaNode:
    """One combined broker and controller: ``port`` is the clients' listener."""

    node_id: int
    port: int
    internal_port: int
    controller_port: int
    root: Path
    proc: subprocess.Popen | None = None

    @property
    def log(self) -> Path:
        return self.root / "server.log"

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class KafkaCluster:
    """``brokers`` KRaft nodes on 127.0.0.1. ``client_protocol`` is the clients' listener's
    security protocol (the brokers and controllers talk PLAINTEXT among themselves);
    ``properties`` are added to every server.properties; ``format_args`` to the storage format
    (``--add-scram ...``); ``client_properties`` what a client needs besides the bootstrap servers
    (security settings); ``jvm`` the brokers' JVM options."""

    root: Path
    brokers: int = 1
    client_protocol: str = "PLAINTEXT"
    properties: dict[str, str] = field(default_factory=dict)
    format_args: list[str] = field(default_factory=list)
    client_properties: dict[str, str] = field(default_factory=dict)  # what a client adds to reach it
    jvm: list[str] = field(default_factory=lambda: JVM_OPTS)
    nodes: list[KafkaNode] = field(init=False)

    def __post_init__(self) -> None:
        self.nodes = [KafkaNode(i + 1, free_port(), free_port(), free_port(), self.root / f"kafka{i + 1}")
                      for i in range(self.brokers)]

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def server_properties(self, node: KafkaNode) -> dict[str, str]:
        replicas = str(min(self.brokers, 3))
        return {
            "process.roles": "broker,controller",
            "node.id": str(node.node_id),
            "controller.quorum.voters": ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self.nodes),
            "listeners": f"CLIENT://127.0.0.1:{node.port},INTERNAL://127.0.0.1:{node.internal_port},"
                         f"CONTROLLER://127.0.0.1:{node.controller_port}",
            "advertised.listeners": f"CLIENT://127.0.0.1:{node.port},INTERNAL://127.0.0.1:{node.internal_port}",
            "listener.security.protocol.map": f"CLIENT:{self.client_protocol},INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "INTERNAL",
            "controller.listener.names": "CONTROLLER",
            "log.dirs": str(node.root / "data"),
            # replicated like a production cluster when there are brokers to fail
            "default.replication.factor": replicas,
            "offsets.topic.replication.factor": replicas,
            "transaction.state.log.replication.factor": replicas,
            "min.insync.replicas": "2" if self.brokers >= 3 else "1",
            "transaction.state.log.min.isr": "2" if self.brokers >= 3 else "1",
            **self.properties,
        }

    def start(self, timeout: float = 90.0) -> KafkaCluster:
        libs = kafka_libs()
        cluster_id = random_cluster_id()
        formats = []
        for node in self.nodes:
            node.root.mkdir(parents=True, exist_ok=True)
            props = node.root / "server.properties"
            props.write_text("".join(f"{k}={v}\n" for k, v in self.server_properties(node).items()))
            (node.root / "log4j2.properties").write_text(LOG4J2)
            formats.append(subprocess.Popen(  # all at once: each is a JVM start
                java(libs, "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(props), *self.format_args),
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        for node, proc in zip(self.nodes, formats):
            out, _ = proc.communicate(timeout=120)
            if proc.returncode != 0:
                raise RuntimeError(f"formatting Kafka node {node.node_id} failed:\n{out}")
        for node in self.nodes:
            self._launch(node, libs)
        self.wait_brokers(len(self.nodes), timeout)
        return self

    def _launch(self, node: KafkaNode, libs: Path) -> None:
        jvm = [*self.jvm, f"-Dlog4j2.configurationFile={node.root / 'log4j2.properties'}"]
        node.proc = subprocess.Popen(java(libs, "kafka.Kafka", str(node.root / "server.properties"), jvm=jvm),
                                     stdout=open(node.log, "a"), stderr=subprocess.STDOUT,
                                     preexec_fn=dies_with_tests())

    def stop_broker(self, index: int, sig: int = signal.SIGTERM, grace: float = 30.0) -> int:
        """Stop node ``index`` (0-based): SIGTERM shuts it down in order (leadership handed over
        first), SIGKILL as a crash. Its exit code."""
        node = self.nodes[index]
        return stop_process(node.proc, grace, sig) if node.proc is not None else 0

    def start_broker(self, index: int, timeout: float = 60.0) -> None:
        """Start node ``index`` again on its data; return once every node is a broker again."""
        node = self.nodes[index]
        if node.running():
            raise RuntimeError(f"Kafka node {node.node_id} is running")
        self._launch(node, kafka_libs())
        self.wait_brokers(sum(n.running() for n in self.nodes), timeout)

    def wait_brokers(self, count: int, timeout: float) -> None:
        """Wait until the cluster's metadata lists ``count`` brokers."""
        adm = self.admin()
        deadline = time.monotonic() + timeout
        seen = 0
        while time.monotonic() < deadline:
            dead = [n for n in self.nodes if n.proc is not None and n.proc.poll() is not None]
            if len(self.nodes) - len(dead) < count:
                raise RuntimeError(f"Kafka node {dead[0].node_id} exited ({dead[0].proc.returncode}); "
                                   f"its log:\n{dead[0].log.read_text()[-3000:]}")
            try:
                seen = len(adm.list_topics(timeout=2).brokers)
            except Exception:  # not up yet: KafkaException, or a transport error
                seen = 0
            if seen >= count:
                return
            time.sleep(0.2)
        raise RuntimeError(f"the Kafka cluster listed {seen} of {count} brokers after {timeout:.0f}s; "
                           f"logs under {self.root}")

    def admin(self) -> AdminClient:
        """An admin client of the cluster's, logging quietly as Federator's clients do."""
        return AdminClient({**kafka.base_config(self.bootstrap_servers), **self.client_properties})

    def leader(self, topic: str, partition: int) -> int:
        """The 0-based index of the node that leads ``topic``'s ``partition`` (-1: none)."""
        md = self.admin().list_topics(topic, timeout=10)
        leader = md.topics[topic].partitions[partition].leader
        return next((i for i, n in enumerate(self.nodes) if n.node_id == leader), -1)

    def stop(self) -> None:
        """Stop every node at once: the cluster's data goes with the test run."""
        for node in self.nodes:
            if node.running():
                node.proc.kill()
        for node in self.nodes:
            if node.proc is not None:
                node.proc.wait()


if __name__ == "__main__":
    # `make kafka`: fetch the jars once per machine, showing Maven's progress
    if not (cache_dir() / "libs" / ".complete").exists():
        print(f"==> fetching Apache Kafka's jars from Maven Central into {cache_dir()} (once per machine)", flush=True)
    print(f"Apache Kafka's jars: {kafka_libs(progress=True)}")
