"""One live three-node cluster for the BI connector tests (a store's names through every front
door, the Postgres protocol, the console, the DB-API driver, the SQLAlchemy dialect); every node
serves Flight SQL and the Postgres protocol too.

The test modules import the ``bi_cluster`` fixture from here. Tests that run one after the
other share one cluster (a cluster costs ~15 s to start and settle), so the modules run
together share it; between them, in a full run, other modules run, and the cluster is not
left idling beside them: it stops, and starts again for the next module.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import duckdb
import pyarrow as pa
import pytest
import sqlglot

from federator.store.layout import window_key
from tests.integration.changelog_util import produce, register
from tests.integration.cluster import Cluster

P = 4
BASE_MS = 1_700_000_000_000 - 1_700_000_000_000 % 3_600_000  # on the hour, so every time grain lines up


def ts(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc)


@dataclass
class BiCluster:
    cluster: Cluster
    db: duckdb.DuckDBPyConnection  # the same rows in DuckDB, to compare answers with
    players: list[dict[str, Any]]
    blobs: list[dict[str, Any]]
    minutes: list[dict[str, Any]]
    app_id: str

    @property
    def nodes(self):
        return self.cluster.nodes

    def url(self, *nodes) -> str:
        """A connect URL listing the given nodes (all of them by default)."""
        return "http://" + ",".join(n.endpoint for n in (nodes or self.nodes))


def _players() -> list[dict[str, Any]]:
    rows = []
    for i in range(60):
        rows.append({
            "player": f"p{i:03d}",
            "team": [None, "red", "blue", "Ünïcode ✓"][i % 4],
            "games": None if i % 7 == 3 else i * 3,
            "score": None if i % 5 == 4 else round(i * 1.25 - 20, 2),
            "active": [True, False, None][i % 3],
            "last_seen": None if i % 11 == 5 else BASE_MS + i * 61_001,
        })
    return rows


def start(broker, root: Path) -> BiCluster:
    app_id = f"bi{uuid.uuid4().hex[:8]}"
    players = register(broker, app_id, {
        "name": "players", "type": "kv", "partitions": P, "key": {"name": "player", "format": "string"},
        "value": {"format": "json", "fields": [
            {"name": "team", "type": "string"}, {"name": "games", "type": "long"},
            {"name": "score", "type": "double"}, {"name": "active", "type": "boolean"},
            {"name": "last_seen", "type": "timestamp"}]},
    })
    prow = _players()
    produce(broker, players.topic, P, [
        (r["player"].encode(), r["player"].encode(),
         players.value.serialize({k: v for k, v in r.items() if k != "player"}), BASE_MS) for r in prow])

    blobs = register(broker, app_id, {"name": "blobs", "type": "kv", "partitions": P, "key": {"name": "id", "format": "int"},
                                      "value": {"name": "payload", "format": "bytes"}})
    brow = [{"id": i, "payload": bytes([i % 256, 0, (255 - i) % 256]) * (i % 3) + b"\x00"} for i in range(-5, 15)]
    produce(broker, blobs.topic, P, [(blobs.key.serialize(r["id"]),) * 2 + (r["payload"], BASE_MS) for r in brow])

    minutes = register(broker, app_id, {"name": "per_minute", "type": "window", "partitions": P,
                                        "key": {"name": "player", "format": "string"},
                                        "value": {"name": "points", "format": "long"}, "window_size_ms": 60_000})
    mrow = [{"player": f"p{i:03d}", "window_start": BASE_MS + m * 60_000 * 7, "points": (i * m) % 13}
            for i in range(10) for m in range(12)]
    produce(broker, minutes.topic, P, [
        (r["player"].encode(), window_key(r["player"].encode(), r["window_start"]),
         minutes.value.serialize(r["points"]), r["window_start"]) for r in mrow])

    cluster = Cluster(broker.bootstrap_servers, app_id, root, size=3, standby_replicas=1, pg=True,
                      flight_sql=True).start()
    try:
        for store in ("players", "blobs", "per_minute"):
            cluster.wait_settled(store, P, timeout=60)
    except BaseException:
        cluster.stop()
        raise

    db = duckdb.connect()
    db.execute("SET TimeZone = 'UTC'")
    db.register("players", pa.table({
        "player": [r["player"] for r in prow], "team": pa.array([r["team"] for r in prow], pa.string()),
        "games": pa.array([r["games"] for r in prow], pa.int64()),
        "score": pa.array([r["score"] for r in prow], pa.float64()),
        "active": pa.array([r["active"] for r in prow], pa.bool_()),
        "last_seen": pa.array([None if r["last_seen"] is None else ts(r["last_seen"]) for r in prow],
                              pa.timestamp("ms", tz="UTC")),
    }))
    db.register("blobs", pa.table({"id": pa.array([r["id"] for r in brow], pa.int32()),
                                   "payload": pa.array([r["payload"] for r in brow], pa.binary())}))
    db.register("per_minute", pa.table({
        "player": [r["player"] for r in mrow],
        "window_start": pa.array([ts(r["window_start"]) for r in mrow], pa.timestamp("ms", tz="UTC")),
        "window_end": pa.array([ts(r["window_start"] + 60_000) for r in mrow], pa.timestamp("ms", tz="UTC")),
        "points": pa.array([r["points"] for r in mrow], pa.int64()),
    }))
    return BiCluster(cluster, db, prow, brow, mrow, app_id)


def unqualified(sql: str, read: str = "postgres") -> str:
    """``sql`` (in dialect ``read``) as DuckDB's over the bare names the oracle's tables have."""
    tree = sqlglot.parse_one(sql, read=read)
    for node in tree.find_all(sqlglot.exp.Table, sqlglot.exp.Column):
        if isinstance(node, sqlglot.exp.Column) and node.args.get("db") is None:
            continue
        node.set("db", None)
        node.set("catalog", None)
    return tree.sql(dialect="duckdb")


_shared: dict[str, BiCluster] = {}


def _stop() -> None:
    if "c" in _shared:
        _shared.pop("c").cluster.stop()


def _uses_me(item: Any) -> bool:
    return "bi_cluster" in getattr(item, "fixturenames", ())


@pytest.fixture
def bi_cluster(broker, tmp_path_factory, request) -> Iterator[BiCluster]:
    """The shared cluster: started by the first test that needs it, kept while the tests that
    run next need it too, and stopped before any other test runs (or at the end of the
    session, when a run stops early)."""
    if "c" not in _shared:
        _shared["c"] = start(broker, tmp_path_factory.mktemp("bi_nodes"))
        request.config.add_cleanup(_stop)
    yield _shared["c"]
    items = request.session.items
    i = items.index(request.node)
    if i + 1 >= len(items) or not _uses_me(items[i + 1]):
        _stop()
