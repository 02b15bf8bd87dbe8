"""A small closed-loop HTTP load generator for the benchmarks, cheap enough to share 2 cores.

Each client is a thread with its own keep-alive HTTP/1.1 connection per server, speaking
raw sockets: a pre-built request goes out, the response is read by Content-Length or
chunked encoding, and the next request follows (closed loop, so N clients = at most N
requests in flight). A raw client costs a few tens of microseconds per request, a
fraction of what urllib3 costs, so it takes less CPU away from the servers it measures;
the client CPU it did use is measured and reported anyway, since it shares the machine.

Latency is measured per request (send to last byte); throughput counts the requests that
started and finished inside the measurement window, after a warm-up.
"""

from __future__ import annotations

import os
import random
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

Addr = tuple[str, int]
# (client index, that client's Random) -> (server address, request bytes)
# (client index, its random) -> (server, request bytes) or (server, request bytes, check): a check
# reads the answer's body and says what is wrong with it (None: right); a wrong answer is an error
RequestMaker = Callable[[int, random.Random], "tuple[Addr, bytes] | tuple[Addr, bytes, Callable[[bytes], str | None]]"]

_CLK_TCK = os.sysconf("SC_CLK_TCK")


def http_request(method: str, addr: Addr, path: str, body: bytes | None = None,
                 content_type: str = "application/json") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {addr[0]}:{addr[1]}", "Accept: */*"]
    if body is not None:
        lines += [f"Content-Type: {content_type}", f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")


class Conn:
    """One keep-alive HTTP/1.1 connection; ``roundtrip`` returns (status, body)."""

    def __init__(self, addr: Addr) -> None:
        self.addr = addr
        self.sock: socket.socket | None = None
        self.buf = bytearray()

    def _connect(self) -> socket.socket:
        s = socket.create_connection(self.addr, timeout=30)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock, self.buf = s, bytearray()
        return s

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def _fill(self) -> None:
        chunk = self.sock.recv(262144)  # type: ignore[union-attr]
        if not chunk:
            raise ConnectionError("server closed the connection")
        self.buf += chunk

    def _take(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def _line(self) -> bytes:
        while (i := self.buf.find(b"\r\n")) < 0:
            self._fill()
        return self._take(i + 2)[:-2]

    def roundtrip(self, request: bytes) -> tuple[int, bytes]:
        sock = self.sock or self._connect()
        try:
            sock.sendall(request)
            while (i := self.buf.find(b"\r\n\r\n")) < 0:
                self._fill()
            head = self._take(i + 4)[:-4].decode("latin-1").split("\r\n")
            status = int(head[0].split(" ", 2)[1])
            headers = {}
            for line in head[1:]:
                k, _, v = line.partition(":")
                headers[k.strip().lower()] = v.strip()
            if "content-length" in headers:
                body = self._take(int(headers["content-length"]))
            elif headers.get("transfer-encoding", "").lower() == "chunked":
                parts = []
                while True:
                    size = int(self._line().split(b";")[0], 16)
                    if size == 0:
                        while self._line():  # trailers, then the empty line
                            pass
                        break
                    parts.append(self._take(size))
                    self._take(2)
                body = b"".join(parts)
            else:  # body until close
                parts = [bytes(self.buf)]
                while chunk := sock.recv(262144):
                    parts.append(chunk)
                body = b"".join(parts)
                self.close()
            if headers.get("connection", "").lower() == "close":
                self.close()
            return status, body
        except BaseException:
            self.close()
            raise


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads) so far."""
    return _stat_cpu(f"/proc/{pid}/stat")


def _stat_cpu(path: str) -> float:
    """User + system CPU time so far in a /proc stat file (a process's, or one of its threads')."""
    with open(path) as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def jit_seconds(pids: Iterable[int]) -> float:
    """CPU time so far of the JIT compiler threads (HotSpot's "C1/C2 CompilerThread") of the
    processes ``pids``: a JVM that has just met a new load compiles its hot code for a minute or
    so, and those cores are taken from everything else on the machine."""
    total = 0.0
    for pid in pids:
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/comm") as f:
                    if "CompilerThre" in f.read():
                        total += _stat_cpu(f"/proc/{pid}/task/{task}/stat")
            except (FileNotFoundError, ProcessLookupError):  # a thread that ended meanwhile
                continue
    return total


def stolen_seconds() -> float:
    """CPU time the hypervisor gave to other guests while this machine's CPUs wanted it
    (/proc/stat's steal, all CPUs), so far: what a row measured on a shared host lacked."""
    with open("/proc/stat") as f:
        return int(f.readline().split()[8]) / _CLK_TCK


@dataclass
class LoadResult:
    label: str
    clients: int
    seconds: float
    latencies: list[float] = field(default_factory=list)  # seconds, sorted
    errors: int = 0  # every answer that was not a right one: other statuses, failed calls, wrong answers
    wrong: int = 0  # of them, answers with the expected status but the wrong value
    first_error: str | None = None
    server_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    stolen_s: float = 0.0  # the host's steal meanwhile (stolen_seconds)

    @property
    def stolen_cores(self) -> float:
        return self.stolen_s / self.seconds

    @property
    def ok(self) -> int:
        return len(self.latencies)

    @property
    def rate(self) -> float:
        return self.ok / self.seconds

    def pct(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        return self.latencies[min(len(self.latencies) - 1, int(q * len(self.latencies)))]

    @property
    def p50_ms(self) -> float:
        return self.pct(0.50) * 1000

    @property
    def p99_ms(self) -> float:
        return self.pct(0.99) * 1000

    @property
    def server_us_per_req(self) -> float:
        return self.server_cpu_s / max(1, self.ok) * 1e6

    @property
    def client_us_per_req(self) -> float:
        return self.client_cpu_s / max(1, self.ok) * 1e6

    def line(self) -> str:
        err = f", {self.errors} errors ({self.first_error})" if self.errors else ""
        return (f"{self.label:<34} {self.clients:>2} clients: {self.rate:8.0f} req/s  p50 {self.p50_ms:6.2f} ms  "
                f"p99 {self.p99_ms:6.2f} ms  server CPU {self.server_us_per_req:5.0f} us/req "
                f"({self.server_cpu_s / self.seconds:.2f} cores), client {self.client_us_per_req:4.0f} us/req{err}")


def run_load(label: str, clients: int, make: RequestMaker, duration: float, warmup: float,
             server_pids: Sequence[int], expect_status: int = 200) -> LoadResult:
    """``clients`` closed-loop clients for warmup + duration seconds; measures the last ``duration``."""
    window: list[float] = []
    barrier = threading.Barrier(clients + 1)
    per_thread: list[tuple[list[float], int, int, str | None]] = [([], 0, 0, None)] * clients

    def client(i: int) -> None:
        rnd = random.Random(1000 + i)
        conns: dict[Addr, Conn] = {}
        lat: list[float] = []
        errors, wrong_answers, first_error = 0, 0, None
        barrier.wait()
        start, end = window
        try:
            while True:
                made = make(i, rnd)
                addr, req = made[0], made[1]
                check = made[2] if len(made) > 2 else None  # type: ignore[misc]
                conn = conns.get(addr) or conns.setdefault(addr, Conn(addr))
                t0 = time.perf_counter()
                if t0 >= end:
                    break
                try:
                    status, body = conn.roundtrip(req)
                except OSError as e:
                    status, body = -1, f"{type(e).__name__}: {e}".encode()
                t1 = time.perf_counter()
                if t0 < start or t1 > end:
                    continue
                wrong = check(body) if check is not None and status == expect_status else None
                if status == expect_status and wrong is None:
                    lat.append(t1 - t0)
                elif wrong is not None:
                    errors += 1
                    wrong_answers += 1
                    first_error = first_error or f"wrong answer: {wrong}"
                else:
                    errors += 1
                    first_error = first_error or f"HTTP {status}: {body[:200].decode('utf-8', 'replace')}"
        finally:
            for c in conns.values():
                c.close()
            per_thread[i] = (lat, errors, wrong_answers, first_error)

    threads = [threading.Thread(target=client, args=(i,), daemon=True, name=f"load-{i}") for i in range(clients)]
    for t in threads:
        t.start()
    now = time.perf_counter()
    window[:] = [now + warmup, now + warmup + duration]
    barrier.wait()
    time.sleep(max(0.0, window[0] - time.perf_counter()))
    cpu0, c0 = sum(cpu_seconds(p) for p in server_pids), time.process_time()
    time.sleep(max(0.0, window[1] - time.perf_counter()))
    cpu1, c1 = sum(cpu_seconds(p) for p in server_pids), time.process_time()
    for t in threads:
        t.join(60)
    out = LoadResult(label, clients, duration, server_cpu_s=cpu1 - cpu0, client_cpu_s=c1 - c0)
    for lat, errors, wrong_answers, first_error in per_thread:
        out.latencies.extend(lat)
        out.errors += errors
        out.wrong += wrong_answers
        out.first_error = out.first_error or first_error
    out.latencies.sort()
    return out
