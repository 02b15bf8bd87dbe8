"""The node's default HTTP server, granian run in-process: the SQL endpoint, request bodies,
streamed answers and errors behave as on waitress, and a shutdown ends it cleanly."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from federator.http.granian_server import GranianServer
from tests.conftest import free_port
from tests.unit.test_sql_routes import run

REPO = Path(__file__).resolve().parents[2]


def _serve(*extra: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tests.unit.granian_fake_node", str(port), *extra],
                            cwd=REPO, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()  # type: ignore[union-attr]
    if line.strip() != "ready":
        proc.kill()
        raise RuntimeError(f"the granian server did not start: {line!r}")
    return proc, port


@pytest.fixture
def granian_port() -> Iterator[int]:
    proc, port = _serve()
    yield port
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0


def _post(port: int, body: bytes | object, chunked: bool = False, accept: str = "application/json") -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("POST", "/v1/sql", body=body, encode_chunked=chunked,  # type: ignore[arg-type]
                 headers={"Content-Type": "application/json", "Accept": accept})
    resp = conn.getresponse()
    data = resp.read()
    headers = {k.lower(): v for k, v in resp.getheaders()}
    conn.close()
    return resp.status, headers, data


def test_sql_answers_errors_and_other_routes(granian_port: int) -> None:
    body = json.dumps({"sql": "SELECT * FROM scores", "parameters": ["x"]}).encode()
    status, headers, data = _post(granian_port, body)
    assert status == 200 and headers["content-type"] == "application/json"
    answer = json.loads(data)
    assert answer["rows"][0][0] == "alice" and answer["consistency_token"] == "tok-abc"

    status, _, data = _post(granian_port, iter([body[:7], body[7:]]), chunked=True)
    assert status == 200 and json.loads(data)["rows"][0][0] == "alice"

    status, _, data = _post(granian_port, b'{"sql": 1}')
    assert status == 400 and json.loads(data)["error"]["code"] == "INVALID_PARAMETER"

    status, headers, data = _post(granian_port, body, accept="text/csv")
    assert status == 200 and headers["content-type"].startswith("text/csv") and data.startswith(b'"player",')

    conn = http.client.HTTPConnection("127.0.0.1", granian_port, timeout=10)
    conn.request("GET", "/v1/sql")
    resp = conn.getresponse()
    assert resp.status == 405 and json.loads(resp.read())["error"]["code"] == "METHOD_NOT_ALLOWED"
    conn.request("GET", "/v1/stores")
    resp = conn.getresponse()
    assert resp.status == 200 and json.loads(resp.read())["stores"][0]["name"] == "scores"
    conn.close()


@pytest.mark.parametrize(("fmt", "message"), [("table", "error: TIMEOUT: partition 5"),
                                              ("csv", "incomplete: TIMEOUT: partition 5"),
                                              ("arrow", "incomplete: the answer failed")])
def test_a_failure_mid_stream_reaches_the_client(fmt: str, message: str) -> None:
    proc, port = _serve("midstream")
    try:
        code, _, err, _ = run(["--url", f"http://127.0.0.1:{port}", "--format", fmt, "SELECT 1"])
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    assert code == 2 and message in err, err


def test_a_taken_port_is_refused_not_shared() -> None:
    """granian binds with SO_REUSEPORT; without the check a second node would share the port."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(OSError, match=f"port {port} on 127.0.0.1 is already in use"):
            GranianServer(lambda environ, start: [], "127.0.0.1", port)
