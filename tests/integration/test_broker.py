"""`federator broker`: prints the bootstrap address once it accepts connections, stops cleanly."""

from __future__ import annotations

import signal
import subprocess

import pytest
from confluent_kafka.admin import AdminClient

from tests.conftest import RunningBroker, federator_cmd, free_port


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_broker_prints_address_accepts_connections_and_stops_on_signal(sig: int, tmp_path) -> None:
    b = RunningBroker(free_port(), tmp_path / "broker.log")
    try:
        assert b.ready_line.strip() == f"broker ready: bootstrap servers {b.bootstrap_servers}"
        md = AdminClient({"bootstrap.servers": b.bootstrap_servers}).list_topics(timeout=10)
        assert md.brokers, "the broker answered metadata with no brokers"
    finally:
        code = b.stop(sig)
    assert code == 0
    assert "broker stopped" in b.log.read_text()
    # the tansu child went with it: nothing listens on the port any more
    from federator.broker import port_open

    assert not port_open("127.0.0.1", b.port)


def test_broker_refuses_a_port_in_use(broker: RunningBroker) -> None:
    proc = subprocess.run(
        federator_cmd("broker", "--port", str(broker.port)), capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1
    assert f"127.0.0.1:{broker.port} is already in use" in proc.stderr
    assert "--port" in proc.stderr
