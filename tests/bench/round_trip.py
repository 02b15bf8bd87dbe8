"""A bare round trip between two processes on this machine, with no Federator code: the least
a routed point read adds to a local one (it crosses to the owner's process and back).

    python -m tests.bench.round_trip serve PORT    (the echo end, a child of ``bare_round_trips``)

The echo end answers each message on a blocking socket in a thread of its own, as the key
port's server does; the asking end sends 16 bytes and waits for them, one at a time. Both ends
are pinned, first to one CPU, then to two different ones: which of the two the scheduler picks
for a routed read's processes changes the cost of the wake-ups a round trip takes (on a virtual
machine, waking a process on another CPU goes through the hypervisor).
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from federator.broker import die_with_parent
from tests.bench.loadgen import cpu_seconds
from tests.conftest import free_port

MESSAGE = b"x" * 16


@dataclass(frozen=True)
class RoundTrip:
    placement: str  # "one CPU" or "two CPUs"
    p50_ms: float
    p99_ms: float
    asking_cpu_us: float  # CPU a round trip cost each end
    echo_cpu_us: float

    def line(self) -> str:
        return (f"on {self.placement}: p50 {self.p50_ms:.3f} ms, p99 {self.p99_ms:.3f} ms, "
                f"{self.asking_cpu_us:.0f} us of CPU at the asking end and {self.echo_cpu_us:.0f} us at the echo end")


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


def bare_round_trips(n: int = 5_000) -> list[RoundTrip]:
    """``n`` round trips to an echo process, one at a time, with both processes on one CPU, then
    (on a machine with two or more) on two different CPUs."""
    cpus = sorted(os.sched_getaffinity(0))
    placements = [("one CPU", cpus[0], cpus[0])] + ([("two CPUs", cpus[0], cpus[1])] if len(cpus) > 1 else [])
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tests.bench.round_trip", "serve", str(port)],
                            stdout=subprocess.PIPE, text=True, preexec_fn=die_with_parent())
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready", "the echo process did not start"
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return [_pinned(conn, proc.pid, placement, asking, echo, n) for placement, asking, echo in placements]
    finally:
        os.sched_setaffinity(0, cpus)
        proc.kill()
        proc.wait()


def _pinned(conn: socket.socket, echo_pid: int, placement: str, asking: int, echo: int, n: int) -> RoundTrip:
    os.sched_setaffinity(0, {asking})
    for tid in os.listdir(f"/proc/{echo_pid}/task"):  # every thread of the echo process
        os.sched_setaffinity(int(tid), {echo})
    _trips(conn, n // 10)  # settled on the CPUs before the count
    mine, theirs = time.process_time(), cpu_seconds(echo_pid)
    times = _trips(conn, n)
    asking_us = (time.process_time() - mine) / n * 1e6
    echo_us = (cpu_seconds(echo_pid) - theirs) / n * 1e6
    cuts = statistics.quantiles(times, n=100)
    return RoundTrip(placement, cuts[49] * 1000, cuts[98] * 1000, asking_us, echo_us)


def _trips(conn: socket.socket, n: int) -> list[float]:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        conn.sendall(MESSAGE)
        got = b""
        while len(got) < len(MESSAGE):
            got += conn.recv(64)
        times.append(time.perf_counter() - t)
    return times


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve(int(sys.argv[2]))
    else:
        for trip in bare_round_trips():
            print(trip.line())
