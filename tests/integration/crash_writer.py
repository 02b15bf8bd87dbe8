"""A materializer to be killed: keeps one shard current from its changelog in small batches,
saying its offset after each one, until the shard has read its changelog to the end."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Sequence

from federator.catalog import StoreDefinition
from federator.node.materializer import ACTIVE, Materializer
from federator.plugin import load_plugins
from federator.store import Shard
from federator.store.layer import WrappedLayer


class Paced(WrappedLayer):
    """Says each write's offset as it lands and pauses after it: the killer, reading those lines,
    then stops the writer within a batch or two of where it chose, never at the log's end by
    chance of a fast run."""

    def apply(self, records: Sequence, through: int | None = None) -> tuple[int, int]:
        before, after = self.inner.apply(records, through)
        if records:
            print(f"applied to {after}", flush=True)
            time.sleep(0.005)
        return before, after


def main() -> None:
    bootstrap, defn_json, state_dir = sys.argv[1:4]
    defn = StoreDefinition.from_json(defn_json, load_plugins())
    shard = Shard(Path(state_dir) / defn.name / "0", defn, 0)
    print(f"start {shard.offset}", flush=True)
    shard.close()
    m = Materializer(bootstrap, Path(state_dir), fetch_wait_ms=10, open_store=lambda p, d, n: Paced(Shard(p, d, n)), batch_size=25)
    m.set_desired({defn.name: defn}, {(defn.name, 0): ACTIVE})
    m.start()
    moves = -1
    while True:
        moves = m.wait_moved(moves, 1.0)
        hosted = m.hosted(defn.name, 0)
        if hosted is not None and hosted.restored:
            break
    m.stop()
    print("done", flush=True)


if __name__ == "__main__":
    main()
