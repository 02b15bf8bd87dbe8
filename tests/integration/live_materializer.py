"""A running materializer watched from outside: hosts partition 0 of one store and prints, as
JSON lines, every state its shard reaches (current or not, the topic id its data came from, its
offset, its keys), until its stdin closes. A child process, so a test sees it die."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

from federator.catalog import StoreDefinition
from federator.node.materializer import ACTIVE, Materializer
from federator.plugin import load_plugins
from federator.query import RangeQuery


def state(m: Materializer, store: str) -> dict | None:
    hosted = m.hosted(store, 0)
    if hosted is None:
        return None
    shard = hosted.shard
    result = shard.run(RangeQuery())
    keys = sorted(result.batch.column("key").to_pylist()) if result.ok else None
    return {"restored": hosted.restored, "source": shard.source, "offset": shard.offset, "keys": keys}


def main() -> None:
    bootstrap, defn_json, state_dir = sys.argv[1:4]
    defn = StoreDefinition.from_json(defn_json, load_plugins())
    m = Materializer(bootstrap, Path(state_dir), fetch_wait_ms=10)
    m.set_desired({defn.name: defn}, {(defn.name, 0): ACTIVE})
    m.start()
    done = threading.Event()

    def wait_for_stdin_closed() -> None:
        sys.stdin.read()
        done.set()

    threading.Thread(target=wait_for_stdin_closed, daemon=True).start()
    moves, last = -1, None
    while not done.is_set():
        moves = m.wait_moved(moves, 0.2)
        now = state(m, defn.name)
        if now is not None and now != last:
            print(json.dumps(now), flush=True)
            last = now
    m.stop()


if __name__ == "__main__":
    main()
