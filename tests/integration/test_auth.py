"""Authentication over the real parts: a node started with --users-file (made by `federator users
add`), asked over HTTP (the SQL fast path, the REST lookup, Flask's routes), by `federator sql`,
the DB-API driver, SQLAlchemy, ADBC over Flight SQL and the console in headless Chromium.
And the nodes that must not start: open on a non-loopback address, a broken users file.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Iterator

import adbc_driver_flightsql.dbapi as flightsql
import adbc_driver_manager
import pytest
import sqlalchemy
import urllib3

import federator.dbapi
from tests.conftest import federator_cmd, free_port
from tests.integration.cluster import NodeProcess

HTTP = urllib3.PoolManager(retries=False)
CHROMIUM = shutil.which("chromium")


class AuthNode:
    def __init__(self, node: NodeProcess, token: str, other: str) -> None:
        self.node, self.token, self.other = node, token, other
        self.url = f"http://{node.endpoint}"


@pytest.fixture(scope="module")
def auth_node(broker, tmp_path_factory) -> Iterator[AuthNode]:
    root = tmp_path_factory.mktemp("auth")
    users = root / "users"
    tokens = []
    for name in ("alice", "bob"):
        done = subprocess.run(federator_cmd("users", "add", name, "--users-file", str(users)),
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert name in done.stderr and "shown this once" in done.stderr
        tokens.append(done.stdout.strip())
    text = users.read_text()
    assert all(t not in text for t in tokens) and text.count("SCRAM-SHA-256$4096:") == 2  # kept hashed
    assert users.stat().st_mode & 0o077 == 0  # readable by its owner only
    node = NodeProcess(broker.bootstrap_servers, f"au{uuid.uuid4().hex[:8]}", "n0", root / "n0",
                       standby_replicas=0, flight_port=free_port(), secret="auth-test-cluster-secret",
                       server="granian")  # through granian; test_access_matrix.py's nodes run the loop server
    node.extra_args = ["--users-file", str(users)]
    node.pg_port = free_port()
    node.start()
    try:
        yield AuthNode(node, tokens[0], tokens[1])
    finally:
        node.stop()


def post_sql(n: AuthNode, sql: str, token: str | None) -> urllib3.BaseHTTPResponse:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return HTTP.request("POST", n.url + "/v1/sql", body=json.dumps({"sql": sql}), headers=headers)


@pytest.mark.parametrize("method,path", [("POST", "/v1/sql"), ("GET", "/v1/stores"), ("GET", "/v1/stores/s/keys/k"),
                                         ("GET", "/v1/metadata"), ("GET", "/v1/plugins")])
def test_public_routes_refuse_a_request_without_a_valid_token(auth_node, method, path) -> None:
    for headers, says in (({}, "needs a bearer token"), ({"Authorization": "Bearer nope"}, "not one of"),
                          ({"Authorization": f"Basic {auth_node.token}"}, "needs a bearer token")):
        resp = HTTP.request(method, auth_node.url + path, body=b'{"sql": "SELECT 1"}' if method == "POST" else None,
                            headers={"Content-Type": "application/json", **headers})
        assert resp.status == 401, (path, headers, resp.status, resp.data[:200])
        assert resp.headers["WWW-Authenticate"].startswith("Bearer")
        err = json.loads(resp.data)["error"]
        assert err["code"] == "UNAUTHENTICATED" and says in err["message"], err


def test_each_users_token_is_answered(auth_node) -> None:
    for token in (auth_node.token, auth_node.other):
        resp = post_sql(auth_node, "SELECT 42 AS answer", token)
        assert resp.status == 200, resp.data[:300]
        assert json.loads(resp.data)["rows"] == [[42]]
    resp = HTTP.request("GET", auth_node.url + "/v1/metadata", headers={"Authorization": f"Bearer {auth_node.token}"})
    assert resp.status == 200 and json.loads(resp.data)["node_id"] == "n0"


@pytest.mark.parametrize("path", ["/", "/console/console.js", "/healthz", "/readyz", "/metrics"])
def test_probes_metrics_and_the_console_files_need_no_token(auth_node, path) -> None:
    resp = HTTP.request("GET", auth_node.url + path)
    assert resp.status in (200, 503), (path, resp.status)  # /readyz may still say "not ready"
    assert resp.status != 401


def test_the_sql_command_sends_its_auth_token(auth_node) -> None:
    base = federator_cmd("sql", "--url", auth_node.url, "--format", "json", "SELECT 7 AS seven")
    done = subprocess.run(base, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "bearer token" in done.stderr, done.stderr
    # --auth-token=T: a token may start with "-", which argparse would take for a flag
    done = subprocess.run([*base, f"--auth-token={auth_node.token}"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and json.loads(done.stdout)["rows"] == [[7]], done.stderr


def test_the_dbapi_driver_and_sqlalchemy_send_the_token(auth_node) -> None:
    with pytest.raises(federator.dbapi.OperationalError) as refused:
        federator.dbapi.connect(auth_node.url).cursor().execute("SELECT 1")
    assert refused.value.code == "UNAUTHENTICATED"
    cur = federator.dbapi.connect(auth_node.url, auth_token=auth_node.token).cursor()
    cur.execute("SELECT 5 AS five")
    assert cur.fetchall() == [(5,)]
    engine = sqlalchemy.create_engine(f"federator://:{auth_node.token}@{auth_node.node.endpoint}")
    with engine.connect() as conn:
        assert conn.execute(sqlalchemy.text("SELECT 6")).scalar() == 6


def test_flight_sql_calls_need_the_token(auth_node) -> None:
    uri = f"grpc://127.0.0.1:{auth_node.node.flight_port}"
    with pytest.raises(adbc_driver_manager.Error) as refused:
        with flightsql.connect(uri) as conn, conn.cursor() as cur:
            cur.execute("SELECT 1")
    assert "UNAUTHENTICATED" in str(refused.value) or "bearer token" in str(refused.value), refused.value
    auth = {"adbc.flight.sql.authorization_header": f"Bearer {auth_node.token}"}
    with flightsql.connect(uri, db_kwargs=auth) as conn, conn.cursor() as cur:
        cur.execute("SELECT 8 AS eight")
        assert cur.fetch_arrow_table().to_pylist() == [{"eight": 8}]


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is missing: make test installs it")
def test_the_console_asks_for_a_token(auth_node) -> None:
    done = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                           "--virtual-time-budget=5000", "--dump-dom", auth_node.url + "/#stores"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-1000:]
    login = done.stdout.split('id="login"', 1)[1].split("</div>", 1)[0]
    assert "hidden" not in login.split(">", 1)[0] and "This node asks for a token." in login, login[:400]
    assert "UNAUTHENTICATED" in done.stdout  # the refused call's error, shown where the stores would be


def node_args(broker, root: Path, *extra: str) -> list[str]:
    return federator_cmd("node", "--bootstrap-servers", broker.bootstrap_servers, "--application-id",
                         f"au{uuid.uuid4().hex[:8]}", "--state-dir", str(root), *extra)


def test_a_node_open_to_other_machines_without_users_does_not_start(broker, tmp_path) -> None:
    done = subprocess.run(node_args(broker, tmp_path / "n", "--listen", f"0.0.0.0:{free_port()}"),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, (done.returncode, done.stderr[-500:])
    assert "--users-file" in done.stderr and "--allow-anonymous" in done.stderr, done.stderr[-500:]


def test_a_broken_users_file_stops_the_node_naming_the_line(broker, tmp_path) -> None:
    users = tmp_path / "users"
    users.write_text("# our users\nalice:SCRAM-SHA-256$4096:c2FsdA==$notbase64!:x\n")
    done = subprocess.run(node_args(broker, tmp_path / "n", "--users-file", str(users)),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and f"{users}:2" in done.stderr and "alice" in done.stderr, done.stderr[-500:]


def test_postgres_logins_check_the_token_with_scram(auth_node) -> None:
    psycopg = pytest.importorskip("psycopg")
    dsn = f"host=127.0.0.1 port={auth_node.node.pg_port} dbname=federator connect_timeout=10"
    for user, token in (("alice", auth_node.token), ("bob", auth_node.other)):
        with psycopg.connect(f"{dsn} user={user}", password=token, autocommit=True) as conn:
            assert conn.execute("SELECT current_user, 1 + 1").fetchone() == (user, 2)
    # another user's token, a wrong one, none, an unknown user: the same refusal, before any query
    for user, token in (("alice", auth_node.other), ("alice", "nope"), ("mallory", auth_node.token)):
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(f"{dsn} user={user}", password=token)
