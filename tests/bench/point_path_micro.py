"""The in-process point path, timed: Node.read_local (a node stub hosting one store, its
stack as a node builds it: Metered(Caching(Shard))) then the point plan's answer for the
stored entry, decoded by the store type. 100k lookups, best of 7.

    PYTHONPATH=. .venv/bin/python tests/bench/point_path_micro.py
"""

from __future__ import annotations

import tempfile
import timeit
import types
from pathlib import Path

import sqlglot

from federator.catalog import StoreDefinition
from federator.node.materializer import ACTIVE, HostedShard
from federator.node.node import Node
from federator.query import PositionBound
from federator.sql.point import point_plan
from federator.store import ChangelogRecord
from federator.store.metered import Meter
from federator.store.scan_cache import ScanCache
from federator.store.stack import open_store
from tests.registry import REGISTRY

N = 100_000


def main() -> None:
    defn = StoreDefinition.from_dict({
        "name": "s", "type": "kv", "topic": "t", "partitions": 1, "key": {"name": "k", "format": "string"},
        "value": {"format": "json", "fields": [{"name": "a", "type": "long"}, {"name": "b", "type": "string"}]},
    }, REGISTRY)
    store = open_store(Path(tempfile.mkdtemp()) / "p", defn, 0, ScanCache(256 << 20), Meter())
    store.apply([ChangelogRecord(f"k{i}".encode(), b'{"a": %d, "b": "x%d"}' % (i, i), i, 1000) for i in range(1000)])
    hs = HostedShard(store, ACTIVE, restored=True, caught_up=True)
    node = types.SimpleNamespace(materializer=types.SimpleNamespace(hosted=lambda s, p: hs))
    plan = point_plan(sqlglot.parse_one("SELECT a, b FROM s WHERE k = ?"), {"s": defn})
    bound = PositionBound.unbounded()
    kb = defn.key.serialize("k42")

    def one():
        local = Node.read_local(node, "s", 0, kb, bound)
        return plan.answer(kb, local.stored)

    assert one().rows == [(42, "x42")], one().rows
    best = min(timeit.repeat(one, number=N, repeat=7))
    print(f"point path: {best / N * 1e6:.3f} us per lookup (best of 7 x {N})")
    store.close()


if __name__ == "__main__":
    main()
