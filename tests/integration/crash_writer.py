"""A shard writer to be killed: catches a shard up from its changelog in small batches, forever."""

from __future__ import annotations

import sys

from federator.catalog import StoreDefinition
from federator.node.changelog import catch_up
from federator.plugin import load_plugins
from federator.store import Shard


def main() -> None:
    bootstrap, defn_json, path = sys.argv[1:4]
    shard = Shard(path, StoreDefinition.from_json(defn_json, load_plugins()), 0)
    print(f"start {shard.offset}", flush=True)
    catch_up(shard, bootstrap, batch_size=25, on_batch=lambda n: print(f"applied {n} to {shard.offset}", flush=True))
    print("done", flush=True)


if __name__ == "__main__":
    main()
