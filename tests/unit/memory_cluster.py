"""A cluster in one process, for the SQL engine's unit tests: nodes whose shards are dicts.

What is real: the node's owner code (``Node.execute``: the store query, then the pushed-down
work — projection, the owner's DuckDB SQL, co-partitioned joins — and ``Node.read_local``
for the point path), the store type's handlers and formats that turn stored bytes into
Arrow, the routing view (ClusterView), the dispatcher, and DuckDB. What is faked: the shard
under a node (``MemoryShard``: entries in a dict, a position moved by ``write``), the
materializer that hosts it, and the HTTP hop between nodes (``MemoryCluster.engine`` hands
another node's calls straight to that node, the request through its wire form). Nothing
here starts a thread of its own, opens a socket or touches Kafka.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from federator.catalog.definition import StoreDefinition
from federator.cluster.membership import ClusterView, NodeInfo
from federator.node.materializer import ACTIVE
from federator.node.node import Node, NodeConfig
from federator.owner.duck import Duck
from federator.partitioner import partition_for
from federator.query.position import Position, PositionBound
from federator.query.queries import Query
from federator.query.request import StateQueryRequest
from federator.query.result import QueryResult
from federator.store.metered import Meter
from federator.sql.engine import SqlEngine
from federator.store.layer import UNBOUNDED, LocalKeyQuery, StoredEntry, StoreLayer, UnsupportedQuery, answer
from federator.store.record import ChangelogRecord
from federator.store.shard import TogetherReads
from federator.store.types import stored_value
from tests.registry import REGISTRY


class MemoryShard(StoreLayer):
    """One partition of a store as a dict of stored entries (key bytes -> rowtime + value
    bytes, as a RocksDB shard keeps them). It is also what the store type's handlers read
    (ShardView's ``get`` and key-ordered ``scan``), so KeyQuery and RangeQuery are answered
    by the store type itself; the position is the offset of the last ``write``."""

    source = None
    closed = False

    def __init__(self, definition: StoreDefinition, partition: int) -> None:
        self.definition, self.partition, self.topic = definition, partition, definition.topic
        self.schema = definition.arrow_schema()
        self.entries: dict[bytes, bytes] = {}
        self.offset: int | None = None

    @property
    def position(self) -> Position:
        return Position() if self.offset is None else Position.of(self.topic, self.partition, self.offset)

    @property
    def base(self) -> StoreLayer:
        return self

    def write(self, key: bytes, value: bytes | None, timestamp: int) -> None:
        """One changelog record applied: the entry put (or deleted, for None) and the offset moved."""
        self.offset = 0 if self.offset is None else self.offset + 1
        if value is None:
            self.entries.pop(key, None)
        else:
            self.entries[key] = stored_value(ChangelogRecord(key, value, self.offset, timestamp))

    # ---- what a store type reads (federator.store.view.ShardView) -------------------------
    def get(self, key: bytes, family: str | None = None) -> bytes | None:
        return self.entries.get(key)

    def scan(self, start: bytes | None = None, stop: bytes | None = None, reverse: bool = False,
             family: str | None = None, fill_cache: bool = True) -> Iterator[tuple[bytes, bytes]]:
        keys = sorted(k for k in self.entries if (start is None or k >= start) and (stop is None or k < stop))
        return iter([(k, self.entries[k]) for k in (reversed(keys) if reverse else keys)])

    # ---- the layer -----------------------------------------------------------------------
    def run(self, query: Query, bound: PositionBound = UNBOUNDED, collect_execution_info: bool = False) -> Any:
        if type(query) is LocalKeyQuery:
            if not bound.is_satisfied_by(self.position, self.topic, self.partition):
                return None
            return StoredEntry(self.entries.get(query.key_bytes), self.position)
        handler = self.definition.store_type.handler_for(query)

        def read():
            if handler is None:
                raise UnsupportedQuery(f"store {self.definition.name!r} does not answer {query.type_name}")
            return handler(self, query), self.position  # type: ignore[arg-type]

        return answer(self, query, bound, collect_execution_info, read)


@dataclass
class Hosted:
    """A shard as the materializer hosts it: an active copy, caught up."""

    shard: MemoryShard
    role: str = ACTIVE
    caught_up: bool = True
    restored: bool = True
    gone: bool = False
    lag: int = 0


class Materializer:
    def __init__(self, shards: dict[tuple[str, int], MemoryShard]) -> None:
        self.shards = shards
        # no copy here is ever reset or handed over: a test that changes a copy's state moves it
        self.epoch = 0

    def hosted(self, store: str, partition: int) -> Hosted | None:
        shard = self.shards.get((store, partition))
        return None if shard is None else Hosted(shard)

    def wait_moved(self, seen: int, timeout: float, hurry: bool = True, want: set | None = None) -> int:
        if seen >= 0:  # writes here are applied as they are made: nothing more comes while one waits
            time.sleep(timeout)
        return 0


class MemoryNode(Node):
    """A Node with its owner code and none of its Kafka: it hosts ``shards``; ``requests``
    records every store query it was asked (in-process or from another node), ``rows_sent`` the
    rows each answer carried, and ``point_reads`` every in-process key read (``read_local``)."""

    def __init__(self, node_id: str, stores: dict[str, StoreDefinition], shards: dict[tuple[str, int], MemoryShard],
                 view: ClusterView, duck: Duck) -> None:
        # not Node.__init__: it builds the Kafka clients, the materializer and the threads; the
        # owner code reads only what is set here
        self.config = NodeConfig("unused:9092", "app", f"{node_id}:1", Path("/nonexistent"), node_id=node_id)
        self.node_id, self.endpoint, self.cluster_secret = node_id, f"{node_id}:1", None
        self.stores, self.unusable_stores, self.view = stores, {}, view
        self.catalog_read = lambda: True  # its stores are given, not read from a catalog
        self.duck = duck
        self.scan_cache = None
        self.materializer = Materializer(shards)
        self.meter, self.together_reads, self._serving = Meter(), defaultdict(TogetherReads), {}
        self.requests: list[StateQueryRequest] = []
        self.rows_sent: list[int] = []
        self.point_reads: list[tuple[str, int]] = []

    def execute(self, request: StateQueryRequest) -> list[QueryResult]:
        self.requests.append(request)
        results = super().execute(request)
        self.rows_sent.append(sum(r.batch.num_rows for r in results if r.batch is not None))
        return results

    def read_local(self, store: str, partition: int, key: bytes, bound: PositionBound) -> StoredEntry | None:
        self.point_reads.append((store, partition))
        return super().read_local(store, partition, key, bound)


class _Client:
    """Another node's internal query endpoint, without HTTP: the request through its wire form."""

    def __init__(self, node: MemoryNode) -> None:
        self.node = node

    def query(self, request: StateQueryRequest, timeout: float | None = None) -> list[QueryResult]:
        return self.node.execute(StateQueryRequest.from_dict(request.to_dict(), REGISTRY.query_types))

    def read_key(self, store: str, topic: str, partition: int, key: bytes, at: int | None,
                 timeout: float) -> StoredEntry | None:
        """The point lookup's lean call: the owner's own in-process read."""
        bound = PositionBound.unbounded() if at is None else PositionBound.at(Position.of(topic, partition, at))
        return self.node.read_local(store, partition, key, bound)

    def send(self, request: StateQueryRequest, timeout: float | None = None) -> "_Sent":
        """The key port's call sent now and read later, as ``CallClient.send``."""
        return _Sent(self.query(request, timeout))


class _AsyncClient(_Client):
    """The key port's client of an event loop (AsyncKeyClient), without a socket."""

    async def read_key(self, store: str, topic: str, partition: int, key: bytes,  # type: ignore[override]
                       at: int | None, timeout: float) -> StoredEntry | None:
        return super().read_key(store, topic, partition, key, at, timeout)


class _Sent:
    def __init__(self, answer: list[QueryResult]) -> None:
        self._answer = answer

    def __call__(self) -> list[QueryResult]:
        return self._answer

    def abandon(self) -> None:
        pass


class _Unwatched:
    """A positions watch that has heard nothing: another node's positions are never known here."""

    closed = False

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint

    def offset(self, store: str, partition: int) -> None:
        return None


class MemoryCluster:
    """``node_ids`` share every store's partitions, partition p on ``node_ids[p % n]`` (so
    co-partitioned stores have partition p on one node, as Kafka's range assignor does);
    ``unowned`` partitions are hosted nowhere. A global store's partitions are on every node
    (one shard, seen by all). The view says so, as heartbeats would."""

    def __init__(self, definitions: list[StoreDefinition], duck: Duck, node_ids: tuple[str, ...] = ("me",),
                 unowned: frozenset[int] = frozenset()) -> None:
        self.stores = {d.name: d for d in definitions}
        self.duck = duck
        self.view = ClusterView(dead_after=math.inf)  # no heartbeats here: nodes never age out of it
        self.shards = {(d.name, p): MemoryShard(d, p) for d in definitions for p in range(d.partitions)}
        self.nodes: dict[str, MemoryNode] = {}
        self.engines: list[SqlEngine] = []
        for i, node_id in enumerate(node_ids):
            mine = {(s, p): shard for (s, p), shard in self.shards.items()
                    if self.stores[s].is_global or (p % len(node_ids) == i and p not in unowned)}
            self.nodes[node_id] = MemoryNode(node_id, self.stores, mine, self.view, duck)
        self._beat()

    def _beat(self) -> None:
        """Every node's heartbeat, saying what it hosts, in the view."""
        for node_id, node in self.nodes.items():
            active: dict[str, list[int]] = {}
            copies: dict[str, list[int]] = {}
            for s, p in sorted(node.materializer.shards):
                (copies if self.stores[s].is_global else active).setdefault(s, []).append(p)
            self.view.update_local(NodeInfo(node_id, node.endpoint, "RUNNING", active,
                                            timestamp_ms=int(time.time() * 1000), key_endpoint=node.endpoint,
                                            global_copies=copies))

    def move(self, store: str, partition: int, to: str) -> None:
        """A rebalance: the partition's shard goes to node ``to``, and the view says so."""
        for node in self.nodes.values():
            shard = node.materializer.shards.pop((store, partition), None)
            if shard is not None:
                self.nodes[to].materializer.shards[(store, partition)] = shard
        self._beat()

    def write(self, store: str, key: Any, value: Any, timestamp: int = 0) -> int:
        """``key``'s new value (None: deleted) in its partition, which the partition number is of."""
        defn = self.stores[store]
        kb = defn.key.serialize(key)
        p = partition_for(kb, defn.partitions)
        self.shards[(store, p)].write(kb, None if value is None else defn.value.serialize(value), timestamp)
        return p

    def position(self) -> Position:
        """Every shard's position: what a statement that read them all reflects."""
        out = Position()
        for shard in self.shards.values():
            out = out.merge(shard.position)
        return out

    def engine(self, node_id: str = "me") -> SqlEngine:
        """The SQL engine of ``node_id``, its calls to other nodes made straight to them."""
        engine = SqlEngine(self.nodes[node_id], REGISTRY)
        engine.dispatcher._client = lambda endpoint: _Client(self.nodes[endpoint.split(":")[0]])  # type: ignore[method-assign]
        engine.dispatcher._key_client = engine.dispatcher._client  # type: ignore[method-assign]
        # and over the key port too, with no socket: a name such as "n2" is no host (its DNS lookup
        # can take the resolver's whole timeout), and nothing else here is a node to connect to
        engine.dispatcher._call_client = engine.dispatcher._client  # type: ignore[method-assign]
        engine.dispatcher._async_key_client = lambda endpoint: _AsyncClient(  # type: ignore[method-assign]
            self.nodes[endpoint.split(":")[0]])
        engine.dispatcher._watch = _Unwatched  # type: ignore[method-assign,assignment]
        self.engines.append(engine)
        return engine

    def requests(self) -> list[StateQueryRequest]:
        return [r for n in self.nodes.values() for r in n.requests]

    def forget(self) -> None:
        """Forget the calls seen so far."""
        for n in self.nodes.values():
            n.requests.clear()
            n.rows_sent.clear()
            n.point_reads.clear()

    def close(self) -> None:
        for engine in self.engines:
            engine.dispatcher.pool.shutdown()
            engine._refs_pool.shutdown()
        for n in self.nodes.values():
            if "_join_workers" in n.__dict__:
                n._join_workers.shutdown()
