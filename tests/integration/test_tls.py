"""TLS over the real parts: two nodes sharing a self-signed certificate made here with openssl
(`--tls-cert/--tls-key`): HTTPS for clients and between the nodes (a scan gathered from both,
a point lookup routed over the key port), Flight SQL over grpc+tls, and plain connections
refused. And the flags' refusals: half a pair, a key that is not the certificate's.
"""

from __future__ import annotations

import json
import ssl
import subprocess
import uuid
from pathlib import Path
from typing import Iterator

import adbc_driver_flightsql.dbapi as flightsql
import pytest
import urllib3

import federator.dbapi
from federator.dispatch.client import NodeClient
from federator.partitioner import partition_for
from federator.tls import Tls
from tests.conftest import federator_cmd, free_port
from tests.certificates import make_certificate
from tests.integration.changelog_util import produce, register
from tests.integration.cluster import Cluster

P = 4


class TlsCluster:
    def __init__(self, cluster: Cluster, cert: Path, rows: dict[str, int]) -> None:
        self.cluster, self.cert, self.rows = cluster, cert, rows
        self.https = urllib3.PoolManager(retries=False, ca_certs=str(cert), cert_reqs="CERT_REQUIRED")

    def sql(self, node, sql: str, **fields) -> dict:
        resp = self.https.request("POST", f"https://{node.endpoint}/v1/sql", body=json.dumps({"sql": sql, **fields}),
                                  headers={"Content-Type": "application/json"})
        assert resp.status == 200, resp.data[:400]
        return json.loads(resp.data)


@pytest.fixture(scope="module")
def tls_cluster(broker, tmp_path_factory) -> Iterator[TlsCluster]:
    root = tmp_path_factory.mktemp("tls")
    cert, key = make_certificate(root)
    app_id = f"tl{uuid.uuid4().hex[:8]}"
    defn = register(broker, app_id, {"name": "scores", "type": "kv", "partitions": P,
                                     "key": {"name": "player", "format": "string"},
                                     "value": {"name": "score", "format": "long"}})
    rows = {f"p{i:02d}": i * 10 for i in range(40)}
    produce(broker, defn.topic, P, [(k.encode(), k.encode(), defn.value.serialize(v), 1_700_000_000_000)
                                    for k, v in rows.items()])
    # n0 on granian, n1 on the loop server: HTTPS from both servers, and between them
    cluster = Cluster(broker.bootstrap_servers, app_id, root, size=2, standby_replicas=0, flight_sql=True, pg=True,
                      servers={0: "granian", 1: "loop"})
    trust = Tls(cert, key)
    for node in cluster.nodes:
        node.extra_args = ["--tls-cert", str(cert), "--tls-key", str(key)]
        node.client = NodeClient(node.endpoint, None, timeout=10, tls=trust)  # the test's own calls, over https
    try:
        for node in cluster.nodes:
            node.start()
        cluster.wait_settled("scores", P, timeout=60)
        yield TlsCluster(cluster, cert, rows)
    finally:
        cluster.stop()


def test_clients_get_answers_over_https_gathered_from_both_nodes(tls_cluster) -> None:
    n0 = tls_cluster.cluster.nodes[0]
    answer = tls_cluster.sql(n0, "SELECT COUNT(*), SUM(score) FROM scores")
    assert answer["rows"] == [[40, sum(tls_cluster.rows.values())]]
    assert answer["stats"]["nodes"] == 2  # the other node's partitions came over https between the nodes
    done = subprocess.run(federator_cmd("sql", "--url", f"https://{n0.endpoint}", "--tls-ca", str(tls_cluster.cert),
                                        "--format", "json", "SELECT COUNT(*) AS n FROM scores"),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and json.loads(done.stdout)["rows"] == [[40]], done.stderr
    cur = federator.dbapi.connect(f"https://{n0.endpoint}", verify=str(tls_cluster.cert)).cursor()
    cur.execute("SELECT player, score FROM scores WHERE player = ?", ["p07"])
    assert cur.fetchall() == [("p07", 70)]


def test_a_point_lookup_routed_to_the_owner_over_the_tls_key_port(tls_cluster) -> None:
    n0, n1 = tls_cluster.cluster.nodes
    owners = {int(p): node["node_id"] for node in n0.metadata()["nodes"] for p in node["active"].get("scores", [])}
    remote = [k for k in tls_cluster.rows if owners[partition_for(k.encode(), P)] == "n1"]
    assert remote and all(node.get("key_endpoint") for node in n0.metadata()["nodes"])
    for key in remote[:5]:  # asked of n0, owned by n1
        answer = tls_cluster.sql(n0, "SELECT score FROM scores WHERE player = ?", parameters=[key])
        assert answer["rows"] == [[tls_cluster.rows[key]]], (key, answer)
    # each went over the key port (a failed TLS call there would fall back to the general path)
    metrics = tls_cluster.https.request("GET", f"https://{n0.endpoint}/metrics").data.decode()
    calls = [line for line in metrics.splitlines()
             if line.startswith("federator_internal_calls_total{") and 'call="key"' in line]
    assert any('outcome="ok"' in line and float(line.rsplit(" ", 1)[1]) >= 5 for line in calls), calls
    assert not any('outcome="FALLBACK"' in line for line in calls), calls


def test_plain_http_and_unverified_certificates_are_refused(tls_cluster) -> None:
    n0 = tls_cluster.cluster.nodes[0]
    plain = urllib3.PoolManager(retries=False)
    with pytest.raises(urllib3.exceptions.HTTPError):
        plain.request("POST", f"http://{n0.endpoint}/v1/sql", body=b'{"sql": "SELECT 1"}', timeout=5)
    untrusting = urllib3.PoolManager(retries=False, cert_reqs="CERT_REQUIRED", ca_certs=ssl.get_default_verify_paths().cafile)
    with pytest.raises(urllib3.exceptions.SSLError):
        untrusting.request("GET", f"https://{n0.endpoint}/healthz", timeout=5)


def test_flight_sql_over_tls(tls_cluster) -> None:
    n1 = tls_cluster.cluster.nodes[1]
    uri = f"grpc+tls://127.0.0.1:{n1.flight_port}"
    roots = {"adbc.flight.sql.client_option.tls_root_certs": tls_cluster.cert.read_text()}
    with flightsql.connect(uri, db_kwargs=roots) as conn, conn.cursor() as cur:
        cur.execute("SELECT COUNT(*) AS n FROM scores")
        assert cur.fetch_arrow_table().to_pylist() == [{"n": 40}]


def test_postgres_over_tls_only(tls_cluster) -> None:
    psycopg = pytest.importorskip("psycopg")
    n0 = tls_cluster.cluster.nodes[0]
    dsn = f"host=127.0.0.1 port={n0.pg_port} dbname=federator user=tester connect_timeout=10"
    with psycopg.connect(f"{dsn} sslmode=verify-full sslrootcert={tls_cluster.cert}", autocommit=True) as conn:
        assert conn.info.pgconn.ssl_in_use
        assert conn.execute("SELECT count(*), sum(score) FROM scores").fetchone() == (40, sum(tls_cluster.rows.values()))
    with pytest.raises(psycopg.OperationalError, match="over TLS only"):
        psycopg.connect(f"{dsn} sslmode=disable")


def node_run(broker, root: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(federator_cmd("node", "--bootstrap-servers", broker.bootstrap_servers, "--application-id",
                                        f"tl{uuid.uuid4().hex[:8]}", "--state-dir", str(root / "n"),
                                        "--listen", f"127.0.0.1:{free_port()}", *extra),
                          capture_output=True, text=True, timeout=60)


def test_bad_tls_flags_stop_the_node_saying_what_to_fix(broker, tmp_path) -> None:
    cert, key = make_certificate(tmp_path, "a")
    _, other_key = make_certificate(tmp_path, "b")
    for extra, says in ((["--tls-cert", str(cert)], "both --tls-cert and --tls-key"),
                        (["--tls-cert", str(cert), "--tls-key", str(other_key)], "check that the key belongs"),
                        (["--tls-cert", str(tmp_path / "nope.pem"), "--tls-key", str(key)], "is not a readable file"),
                        (["--tls-cert", str(cert), "--tls-key", str(key), "--server", "waitress"], "not waitress")):
        done = node_run(broker, tmp_path, *extra)
        assert done.returncode == 2 and says in done.stderr, (extra, done.returncode, done.stderr[-400:])

