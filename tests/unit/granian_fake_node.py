"""The SQL routes' fake node served by GranianServer, in its own process (granian must run in
a main thread): ``python -m tests.unit.granian_fake_node PORT [midstream]``."""

from __future__ import annotations

import sys
import threading

from federator.http import create_app
from federator.http.granian_server import GranianServer
from federator.sql import limits
from tests.unit.test_sql_routes import FakeSqlNode, MidStreamFailure
from tests.registry import REGISTRY


def main() -> int:
    port = int(sys.argv[1])
    node = MidStreamFailure(rows_before=5000) if sys.argv[2:] == ["midstream"] else FakeSqlNode()
    if sys.argv[2:] == ["midstream"]:
        limits.READ_AHEAD_BYTES = 1  # the failure comes after the answer has started, as in a large one
    stopping = threading.Event()
    server = GranianServer(create_app(node, REGISTRY), "127.0.0.1", port, threads=2, on_signal=stopping.set)

    def stop_when_asked() -> None:
        server.listening.wait()
        print("ready", flush=True)
        stopping.wait()
        server.stop()

    threading.Thread(target=stop_when_asked, daemon=True).start()
    server.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
