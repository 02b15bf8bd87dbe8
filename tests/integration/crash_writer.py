"""A materializer to be killed: keeps one shard current from its changelog in small batches,
saying its offset as it moves, until the shard has read its changelog to the end."""

from __future__ import annotations

import sys
from pathlib import Path

from federator.catalog import StoreDefinition
from federator.node.materializer import ACTIVE, Materializer
from federator.plugin import load_plugins
from federator.store import Shard


def main() -> None:
    bootstrap, defn_json, state_dir = sys.argv[1:4]
    defn = StoreDefinition.from_json(defn_json, load_plugins())
    shard = Shard(Path(state_dir) / defn.name / "0", defn, 0)
    print(f"start {shard.offset}", flush=True)
    shard.close()
    m = Materializer(bootstrap, Path(state_dir), batch_size=25)
    m.set_desired({defn.name: defn}, {(defn.name, 0): ACTIVE})
    m.start()
    moves = -1
    while True:
        moves = m.wait_moved(moves, 1.0)
        hosted = m.hosted(defn.name, 0)
        if hosted is None:
            continue
        print(f"applied to {hosted.shard.offset}", flush=True)
        if hosted.restored:
            break
    m.stop()
    print("done", flush=True)


if __name__ == "__main__":
    main()
