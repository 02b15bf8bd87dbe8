"""The baseline of a routed point read with no query engine: front_server's ``protocol`` front
(httptools on uvloop, nothing of Federator), answering the REST lookup of a key at once (local),
or after reading the key from another process over the key port (routed), as a node's loop
does: ``AsyncKeyClient`` to a ``KeyServer`` whose read is a constant. What a routed read costs
beside a local one before any Federator work.

    python -m tests.bench.bare_hop owner PORT                (the key port's end)
    python -m tests.bench.bare_hop http PORT KEYS [KEY_PORT] (the HTTP end; with KEY_PORT, routed)
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from pathlib import Path
from typing import Sequence

from federator.broker import die_with_parent
from tests.bench.front_server import Answer, HttpProtocol, answerer, serve_protocol
from tests.bench.wrk import WrkResult, run_wrk
from tests.conftest import free_port, stop_process


def owner(port: int) -> None:
    from federator.node.key_server import KeyServer
    from federator.query.position import Position
    from federator.store.layer import StoredEntry

    entry = StoredEntry(b"\x00" * 8 + b"value", Position.of("t", 0, 41))
    KeyServer(lambda store, partition, key, bound: entry, lambda store: "t", None, "127.0.0.1", port).start()
    print("ready", flush=True)
    threading.Event().wait()


class _Routed(HttpProtocol):
    """front_server's protocol, each answer written after one key read from the owner (in the
    requests' order, as a pipelining client expects)."""

    def __init__(self, answer: Answer, client) -> None:
        super().__init__(answer)
        self.client = client
        self.last: asyncio.Future | None = None

    def on_message_complete(self) -> None:
        path = self.url.split(b"?", 1)[0].decode("latin-1")
        status, out = self.answer(self.parser.get_method().decode("latin-1"), path, bytes(self.body))
        self.last = asyncio.ensure_future(self._after_read(self.last, status, out, self.parser.should_keep_alive()))

    async def _after_read(self, before: asyncio.Future | None, status: int, out: bytes, keep_alive: bool) -> None:
        entry = await self.client.read_key("kv", "t", 0, b"key", None, 5.0)
        assert entry is not None, "the key port did not answer"
        if before is not None:
            await before
        self._write(status, out, keep_alive)


def serve_routed(answer: Answer, port: int, key_port: int) -> None:
    import uvloop

    from federator.dispatch.key_client_async import AsyncKeyClient

    async def main() -> None:
        client = AsyncKeyClient(f"127.0.0.1:{key_port}")
        server = await asyncio.get_running_loop().create_server(lambda: _Routed(answer, client), "127.0.0.1", port)
        print("ready", flush=True)
        await server.serve_forever()

    uvloop.run(main())


def _start(*args: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "tests.bench.bare_hop", *args], stdout=subprocess.PIPE, text=True,
                            preexec_fn=die_with_parent())
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready", f"bare_hop {args[0]} did not start"
    return proc


def bare_hops(keys_file: Path, clients: Sequence[int], seconds: float,
              warmup: float) -> dict[tuple[str, int], WrkResult]:
    """wrk (the REST lookup's GETs) at each of ``clients`` against the local and the routed
    server; server CPU sums the HTTP process and, routed, the key port's."""
    key_port, local_port, routed_port = free_port(), free_port(), free_port()
    procs = [_start("owner", str(key_port))]
    try:
        procs += [_start("http", str(local_port), str(keys_file)),
                  _start("http", str(routed_port), str(keys_file), str(key_port))]
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
        keys = Path(sys.argv[3]).read_text().splitlines()
        answer = answerer({key: i for i, key in enumerate(keys)}, 0.0)
        if len(sys.argv) > 4:
            serve_routed(answer, int(sys.argv[2]), int(sys.argv[4]))
        else:
            serve_protocol(answer, int(sys.argv[2]))
