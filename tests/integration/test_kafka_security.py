"""A node on an Apache Kafka cluster that asks what managed services ask: SASL_SSL with SCRAM-SHA-512
users and a certificate of its own CA, the client properties given as a file (--kafka-config).
With the right file the node serves; a wrong password or a wrong CA stops it at start with a
message that says which. The password is in no log, metadata, metric or message."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path
from typing import Iterator

import pytest
import urllib3

from federator import kafka
from federator.catalog import Catalog
from federator.kafka_properties import load, parse
from tests.apache_kafka import KafkaCluster
from tests.certificates import make_certificate
from tests.conftest import federator_cmd, free_port
from tests.integration.cluster import NodeProcess, wait_for, write_with_token
from tests.registry import REGISTRY

# The how-to's file (docs/how-to/kafka-cluster.md), given this cluster's password and CA
EXAMPLE = Path(__file__).with_name("kafka-cluster.properties")
USER, PASSWORD = "federator", f"pw-{uuid.uuid4().hex}"  # a password no other text contains
SCRAM = "SCRAM-SHA-512"
pytestmark = pytest.mark.apache_kafka


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KafkaCluster, Path]]:
    """One broker whose clients' listener is SASL_SSL; and a client properties file that reaches it."""
    root = tmp_path_factory.mktemp("secured-kafka")
    cert, key = make_certificate(root, "broker")
    keystore = root / "broker-keystore.pem"  # Kafka's PEM keystore: the private key, then the certificate
    keystore.write_text(key.read_text() + cert.read_text())
    client = {**parse(EXAMPLE.read_text(), str(EXAMPLE)), "sasl.password": PASSWORD, "ssl.ca.location": str(cert)}
    assert (client["sasl.username"], client["sasl.mechanism"]) == (USER, SCRAM)
    cluster = KafkaCluster(
        root, brokers=1, client_protocol="SASL_SSL",
        properties={
            "sasl.enabled.mechanisms": SCRAM,
            "listener.name.client.ssl.keystore.type": "PEM",
            "listener.name.client.ssl.keystore.location": str(keystore),
            "listener.name.client.scram-sha-512.sasl.jaas.config":
                "org.apache.kafka.common.security.scram.ScramLoginModule required;",
        },
        format_args=["--add-scram", f"{SCRAM}=[name={USER},password={PASSWORD}]"],
        client_properties=client,
    ).start()
    try:
        yield cluster, properties_file(root / "client.properties", client)
    finally:
        cluster.stop()


def properties_file(path: Path, values: dict[str, str]) -> Path:
    path.write_text("# the cluster's client properties\n" + "".join(f"{k}={v}\n" for k, v in values.items()))
    return path


def node(cluster: KafkaCluster, config: Path, root: Path, app: str) -> NodeProcess:
    n = NodeProcess(cluster.bootstrap_servers, app, "n0", root / "n0", standby_replicas=0)
    n.extra_args = ["--kafka-config", str(config)]
    return n


def test_a_node_with_the_clusters_client_properties_serves_and_shows_no_secret(secured, app_id, tmp_path) -> None:
    cluster, config = secured
    store = subprocess.run(federator_cmd("store", "create", "sec", "--type", "kv", "--partitions", "2", "--key",
                                         "string", "--value", "long", "--bootstrap-servers", cluster.bootstrap_servers,
                                         "--application-id", app_id, "--kafka-config", str(config)),
                           capture_output=True, text=True, timeout=60)
    assert store.returncode == 0, store.stderr
    n = node(cluster, config, tmp_path, app_id).start()
    try:
        wait_for(lambda: n.ready(), 60, "the node to be ready")
        kafka.use_client_properties(cluster.bootstrap_servers, load(config))  # this process writes too
        defn = Catalog(cluster.bootstrap_servers, app_id, REGISTRY).get("sec")
        token = write_with_token(cluster.bootstrap_servers, defn, {"a": 1, "b": 2})
        status, body = n.sql("SELECT key, value FROM sec ORDER BY key", consistency_token=token.to_token())
        assert status == 200 and body["rows"] == [["a", 1], ["b", 2]], body
        shown = [n.client.get_json("/v1/metadata")[1],
                 urllib3.request("GET", f"http://{n.endpoint}/metrics").data.decode()]
    finally:
        n.stop()
    for text in [*map(str, shown), n.log.read_text(), store.stdout, store.stderr]:
        assert PASSWORD not in text


@pytest.mark.parametrize("wrong", ["password", "ca"])
def test_a_wrong_password_or_ca_stops_the_node_at_start_saying_which(secured, app_id, tmp_path, wrong) -> None:
    cluster, config = secured
    values = dict(line.split("=", 1) for line in config.read_text().splitlines() if "=" in line)
    if wrong == "password":
        values["sasl.password"] = "not-" + PASSWORD
    else:
        values["ssl.ca.location"] = str(make_certificate(tmp_path, "other-ca")[0])
    bad = properties_file(tmp_path / "bad.properties", values)
    n = node(cluster, bad, tmp_path, app_id)
    n.start(wait=False)
    assert n.proc.wait(60) == 2
    text = n.log.read_text()
    if wrong == "password":
        assert f"refused the SASL credentials of sasl.username '{USER}' (sasl.mechanism {SCRAM})" in text, text
        assert "check sasl.username and sasl.password in " + str(bad) in text, text
    else:
        assert ("the Kafka brokers' TLS certificate is not signed by the CA certificate in ssl.ca.location "
                f"({values['ssl.ca.location']})") in text, text
    assert PASSWORD not in text and "not-" + PASSWORD not in text


@pytest.mark.skipif(os.environ.get("FEDERATOR_APACHE_KAFKA") != "only", reason="a Spark run: make test-kafka runs it")
def test_the_demo_runs_on_the_secured_cluster_with_its_file(secured, tmp_path) -> None:
    cluster, config = secured
    done = subprocess.run(federator_cmd("demo", "--events", "2000", "--exit", "--dir", str(tmp_path / "demo"),
                                        "--bootstrap-servers", cluster.bootstrap_servers, "--kafka-config", str(config)),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"running on the Kafka cluster at {cluster.bootstrap_servers}" in done.stdout
    assert "SELECT player, total_score FROM leaderboard" in done.stdout and "done (--exit)" in done.stdout
    logs = [p.read_text() for p in (tmp_path / "demo").glob("*.log")]
    assert logs and all(PASSWORD not in text for text in [done.stdout, done.stderr, *logs])
