"""The baseline of a routed point read with no query engine: an HTTP server on a uvloop event
loop that answers each request at once (local), or after reading one key from another process
(routed) over the key port, as a node's loop does: ``AsyncKeyClient`` to a ``KeyServer`` whose
read is a constant. What a routed read costs beside a local one before any Federator work.

    python -m tests.bench.bare_hop owner PORT          (the key port's end, a constant read)
    python -m tests.bench.bare_hop http PORT [KEY_PORT] (the HTTP end; with KEY_PORT, routed)
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from pathlib import Path
from typing import Sequence

from federator.broker import die_with_parent
from tests.bench.wrk import WrkResult, run_wrk
from tests.conftest import free_port, stop_process

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"


def owner(port: int) -> None:
    from federator.node.key_server import KeyServer
    from federator.query.position import Position
    from federator.store.layer import StoredEntry

    entry = StoredEntry(b"\x00" * 8 + b"value", Position.of("t", 0, 41))
    KeyServer(lambda store, partition, key, bound: entry, lambda store: "t", None, "127.0.0.1", port).start()
    print("ready", flush=True)
    threading.Event().wait()


def http(port: int, key_port: int | None) -> None:
    import uvloop

    from federator.dispatch.key_client_async import AsyncKeyClient

    async def main() -> None:
        client = AsyncKeyClient(f"127.0.0.1:{key_port}") if key_port is not None else None
        server = await asyncio.get_running_loop().create_server(lambda: _Http(client), "127.0.0.1", port)
        print("ready", flush=True)
        async with server:
            await server.serve_forever()

    uvloop.run(main())


class _Http(asyncio.Protocol):
    """Requests without bodies (wrk's GETs), answered in their order."""

    def __init__(self, client) -> None:
        self.client, self.buf, self.transport = client, b"", None
        self.pending: asyncio.Future | None = None  # the last routed answer, which the next waits for

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while b"\r\n\r\n" in self.buf:
            _, _, self.buf = self.buf.partition(b"\r\n\r\n")
            if self.client is None:
                self.transport.write(ANSWER)
            else:
                self.pending = asyncio.ensure_future(self._routed(self.pending))

    async def _routed(self, before: asyncio.Future | None) -> None:
        entry = await self.client.read_key("kv", "t", 0, b"key", None, 5.0)
        assert entry is not None, "the key port did not answer"
        if before is not None:
            await before
        self.transport.write(ANSWER)


def _start(*args: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "tests.bench.bare_hop", *args], stdout=subprocess.PIPE, text=True,
                            preexec_fn=die_with_parent())
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready", f"bare_hop {args[0]} did not start"
    return proc


def bare_hops(keys_file: Path, clients: Sequence[int], seconds: float,
              warmup: float) -> dict[tuple[str, int], WrkResult]:
    """wrk (GETs, as the REST lookup's) at each of ``clients`` against the local and the routed
    server; server CPU sums the HTTP process and, routed, the key port's."""
    key_port, local_port, routed_port = free_port(), free_port(), free_port()
    procs = [_start("owner", str(key_port))]
    try:
        procs += [_start("http", str(local_port)), _start("http", str(routed_port), str(key_port))]
        pids = {"local": [procs[1].pid], "routed": [procs[2].pid, procs[0].pid]}
        ports = {"local": local_port, "routed": routed_port}
        out = {}
        for c in clients:
            for mode in ("local", "routed"):
                url = f"http://127.0.0.1:{ports[mode]}"
                run_wrk("warm-up", url, "rest", keys_file, c, warmup)
                out[(mode, c)] = run_wrk(f"bare hop, {mode}", url, "rest", keys_file, c, seconds, pids[mode])
        return out
    finally:
        for proc in procs:
            stop_process(proc, 5)


if __name__ == "__main__":
    if sys.argv[1] == "owner":
        owner(int(sys.argv[2]))
    else:
        http(int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else None)
