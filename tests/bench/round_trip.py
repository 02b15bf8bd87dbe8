"""A bare round trip between two processes on this machine, with no Federator code: the least
a routed point read adds to a local one (it crosses to the owner's process and back).

    python -m tests.bench.round_trip serve PORT    (the echo end, a child of ``bare_round_trip``)

The echo end answers each message on a blocking socket in a thread of its own, as the key
port's server does; the asking end sends 16 bytes and waits for them, one at a time.
"""

from __future__ import annotations

import socket
import statistics
import subprocess
import sys
import threading
import time

from federator.broker import die_with_parent
from tests.conftest import free_port

MESSAGE = b"x" * 16


def serve(port: int) -> None:
    listener = socket.create_server(("127.0.0.1", port))
    print("ready", flush=True)
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=_echo, args=(conn,), daemon=True).start()


def _echo(conn: socket.socket) -> None:
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    with conn:
        while data := conn.recv(64):
            conn.sendall(data)


def bare_round_trip(n: int = 5_000) -> tuple[float, float]:
    """The p50 and p99 in ms of ``n`` round trips to an echo process, one at a time."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tests.bench.round_trip", "serve", str(port)],
                            stdout=subprocess.PIPE, text=True, preexec_fn=die_with_parent())
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready", "the echo process did not start"
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            times = []
            for _ in range(n):
                t = time.perf_counter()
                conn.sendall(MESSAGE)
                got = b""
                while len(got) < len(MESSAGE):
                    got += conn.recv(64)
                times.append(time.perf_counter() - t)
        cuts = statistics.quantiles(times, n=100)
        return cuts[49] * 1000, cuts[98] * 1000
    finally:
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    serve(int(sys.argv[2]))
