"""A Federator node: follows the catalog, owns partitions through the Kafka group, keeps standby
copies, publishes its heartbeat, and answers per-partition queries for the shards it hosts."""

from __future__ import annotations

import functools
import logging
import threading
import time
import uuid
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import pyarrow as pa
from confluent_kafka import KafkaException, Message

from federator import kafka
from federator.catalog.catalog import COMPACTED, Catalog, apply_catalog_message, catalog_topic
from federator.catalog.definition import StoreDefinition
from federator.node import internal_query
from federator.node.key_server import KeyServer
from federator.node.group import GroupMember
from federator.node.timings import GroupTimings
from federator.node.materializer import ACTIVE, STANDBY, HostedShard, Materializer
from federator.metrics import Metrics
from federator.cluster.membership import (
    HEARTBEAT_SECONDS,
    ClusterView,
    NodeInfo,
    nodes_topic,
    place_standbys,
    same_id,
)
from federator.node.topic_tail import TopicTail
from federator.partitioner import partition_for
from federator.plugin.loader import PluginsFailed
from federator.plugin.registry import Registry
from federator.query.position import Position, PositionBound
from federator.query.queries import KeyQuery, Query, RangeQuery
from federator.errors import FederatorError, SqlError, as_error
from federator.owner import keyjoin
from federator.owner.duck import Duck, DuckConfig
from federator.owner.keyjoin import LEFT, RIGHT
from federator.owner.work import followed_answer, owners_sql
from federator.store.layer import UNBOUNDED, LocalKeyQuery, StoredEntry
from federator.store.together import answer_together, together_refused, unchanged_since
from federator.store.types import TogetherHandler
from federator.store.metered import Meter, count
from federator.store.shard_answers import DEFAULT_PER_SHARD, ShardAnswers
from federator.store.scan_cache import DEFAULT_FOLLOW, DEFAULT_MB, ScanCache
from federator.store.shard import TogetherReads
from federator.store.stack import open_store
from federator.settings import PLUGIN_ERRORS, NodeSettings
from federator.tls import Tls
from federator.query.request import StateQueryRequest
from federator.query.result import FailureReason, QueryResult

log = logging.getLogger(__name__)

# How long an owner holds a read whose consistency token it has not reached before refusing it
# (NOT_UP_TO_BOUND): long enough for records already fetched, or in the fetch under way, to be
# applied (the wait cuts the apply linger short), short enough that a token far ahead is refused
# while the asker still has time to ask again. Not the linger: that may be much longer.
TOKEN_WAIT_S = 0.02


@dataclass
class _Execution:
    """One ``execute``: its results in partition order (None: deferred) and the work over
    several partitions still to do."""

    followable: bool  # pushed-down SQL that may follow a kept result instead of reading scans
    results: list[QueryResult | None] = field(default_factory=list)
    # (result, partition, its store) whose pushed-down SQL may follow a kept result
    deferred: list[tuple[int, int, Any]] = field(default_factory=list)
    # a co-partitioned join: (result, its shard, the other store's rows, their shard); a join
    # with a global store: its rows read whole here, once (``broadcast``)
    joined: list[tuple[int, Any, pa.RecordBatch | None, Any]] = field(default_factory=list)
    broadcast: tuple[pa.Table, Position] | QueryResult | None = None
    owned: list[tuple[int, Any]] = field(default_factory=list)  # (result, its shard) the pushed-down SQL runs over


@dataclass
class NodeConfig:
    bootstrap_servers: str
    application_id: str
    listen: str
    state_dir: Path
    advertise: str | None = None
    standby_replicas: int = 0
    node_id: str | None = None
    cluster_secret: str | None = field(default=None, repr=False)  # never in a logged or printed config
    tls: Tls | None = None  # --tls-cert/--tls-key/--tls-ca (federator.tls)
    duckdb_memory_limit: str = NodeSettings.duckdb_memory_limit  # DuckDB's memory_limit; past it, queries spill under state_dir/spill
    reuse_answers_seconds: float = NodeSettings.reuse_answers_seconds  # how long the receiver reuses an answer over unchanged positions
    # A plugin that failed to load: "fatal" stops the node before it joins anything (the
    # default: a node must not serve a cluster some of whose stores or queries it cannot);
    # "warn" logs it and serves without it.
    plugin_errors: str = "fatal"
    scan_cache_mb: int = DEFAULT_MB  # the scan cache's budget (0: off); see federator.store.scan_cache
    scan_cache_follow: int = DEFAULT_FOLLOW  # writes a kept scan follows before it is read again (0: never)
    shard_answers: int = DEFAULT_PER_SHARD  # small answers each shard keeps until its next write (0: off)
    statement_answers: int = NodeSettings.statement_answers  # repeated statements' answers kept here (0: off)
    partition_answers_mb: int = NodeSettings.partition_answers_mb  # other nodes' partition answers kept here
    # The public query entries' limits (federator.sql.limits has the defaults and their use);
    # None: that default.
    max_body_bytes: int | None = None
    max_sql_chars: int | None = None
    max_answer_rows: int | None = None
    max_answer_bytes: int | None = None
    max_timeout_ms: int | None = None
    max_running_queries: int | None = None
    max_queued_queries: int | None = None
    # The port of the point lookup's node-to-node call (federator.node.key_server), on the
    # listen host; 0: any free port (peers learn it from the heartbeat); None: none, and
    # peers read this node's keys on the general path.
    key_port: int | None = 0
    group_timings: GroupTimings = GroupTimings()  # session timeout and heartbeat in the group
    fetch_wait_ms: int = NodeSettings.fetch_wait_ms  # how long the broker may hold a changelog fetch
    apply_linger_ms: int = NodeSettings.apply_linger_ms  # how long fetched records may gather before they are applied


def _node_id(state_dir: Path) -> str:
    """A node id kept in the state dir, so a restarted node is the same node."""
    path = state_dir / "node-id"
    if path.exists():
        return path.read_text().strip()
    node_id = f"node-{uuid.uuid4().hex[:8]}"
    path.write_text(node_id + "\n")
    return node_id


def _answerable(hs: Any) -> bool:
    return hs.role == ACTIVE and hs.restored and hs.caught_up and not hs.gone


def _serves(hs: HostedShard | None, require_active: bool) -> bool:
    """Whether this copy may answer a read (``require_active``: only as the restored active
    copy); ``Node._copy_for`` says why one may not."""
    return hs is not None and not hs.gone and hs.caught_up and (not require_active or _answerable(hs))


def _offset(hs: Any) -> int:
    return _shard_offset(hs.shard)


def _shard_offset(shard: Any) -> int:
    offset = shard.offset
    return -1 if offset is None else offset


def _beside(left: QueryResult, broadcast: tuple[pa.Table, Position] | QueryResult) -> QueryResult:
    """``left`` to be joined with a global store's rows and their positions (``broadcast``):
    with those positions too, or failed as they failed."""
    if isinstance(broadcast, QueryResult):
        return QueryResult.failed(left.partition, broadcast.failure or FailureReason.STORE_EXCEPTION,
                                  broadcast.message, code=broadcast.code)
    left.position = left.position.merge(broadcast[1])
    return left


def _project(columns: list[str], result: QueryResult) -> QueryResult:
    """The columns a query reads of a partition's rows, and nothing else to do with them."""
    if result.batch is None:  # an answer without rows has none to project
        return result
    try:
        result.batch = result.batch.select(columns)
    except (KeyError, ValueError, TypeError) as e:
        return QueryResult.failed(result.partition, FailureReason.STORE_EXCEPTION, f"{type(e).__name__}: {e}")
    return result


def _behind(bound: Position, defn: StoreDefinition | None, results: list[QueryResult]) -> dict[int, int]:
    """Partition -> the offset ``bound`` asks of it, for the partitions of ``defn`` that
    refused a read as not there yet (NOT_UP_TO_BOUND)."""
    if defn is None:
        return {}
    wanted = {r.partition: bound.get(defn.topic, r.partition) for r in results
              if r.failure is FailureReason.NOT_UP_TO_BOUND}
    return {p: o for p, o in wanted.items() if o is not None}


def _together_handler(request: StateQueryRequest, defn: StoreDefinition | None) -> TogetherHandler | None:
    """How a global store answers the request from every partition at once, if it does: for
    the query types its store type names, when the owners' work is at most keeping columns."""
    if defn is None or not defn.is_global:
        return None
    work = request.work
    if work is not None and (work.sql is not None or work.join is not None):
        return None
    return defn.store_type.together_handlers.get(type(request.query))


class Node:
    def __init__(self, config: NodeConfig, registry: Registry) -> None:
        """``registry``: the formats, store types, query types and SQL rules this node knows
        (``federator.plugin.load_plugins()``); the node passes it to whatever it starts."""
        if config.plugin_errors not in PLUGIN_ERRORS:
            raise ValueError(f"--plugin-errors must be one of {', '.join(PLUGIN_ERRORS)}, got {config.plugin_errors!r}")
        # Before anything is read or joined: a broken plugin stops the node here, loudly.
        if registry.failures and config.plugin_errors == "fatal":
            raise PluginsFailed(registry.failures, "fix or uninstall it, leave it out with FEDERATOR_PLUGINS, "
                                                   "or start the node with --plugin-errors warn to serve without it")
        self.registry = registry
        self.config = config
        self.state_dir = Path(config.state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.node_id = config.node_id or _node_id(self.state_dir)
        for plugin in registry.plugins:
            log.info("plugin %s (%s %s): %s", plugin.name, plugin.distribution, plugin.version,
                     ", ".join(plugin.provides) or "nothing")
        for failure in registry.failures:
            log.warning("serving without a plugin (--plugin-errors warn): %s", failure)
        self.endpoint = config.advertise or config.listen
        self.key_server: KeyServer | None = None  # started with the node (NodeConfig.key_port)
        self.key_endpoint: str | None = None
        self.cluster_secret = config.cluster_secret
        self.tls = config.tls  # its servers' certificate, and whom it trusts when it calls peers
        self.state = "CREATED"
        # This process, as told apart from any other that uses (or used) the same node id.
        self.incarnation = uuid.uuid4().hex[:12]
        self.started_ms = int(time.time() * 1000)
        self.refused: str | None = None  # why this node will not serve (another live process has its id, ...)
        self.on_refused: Callable[[str], None] = lambda why: None  # the process exits (federator node)
        self._rival: NodeInfo | None = None  # the latest record of another process under our id
        self._warned: set[str] = set()  # newer rivals already reported
        self._identity_checked = threading.Event()
        self.stores: dict[str, StoreDefinition] = {}
        self.unusable_stores: dict[str, str] = {}  # store name -> why this node cannot host it
        self._assigned: frozenset[tuple[str, int]] = frozenset()
        self._wake = threading.Event()
        self._stop = threading.Event()
        app, bootstrap = config.application_id, config.bootstrap_servers
        self.view = ClusterView()
        # One scan cache, one shard-answers count and one meter for all of this node's stores: each
        # store's stack is Metered(ShardAnswers(Caching(Shard))) over them (federator.store.stack), and
        # the owner's work keeps its results in the scan cache.
        self.scan_cache = ScanCache(config.scan_cache_mb << 20, config.scan_cache_follow)
        self.shard_answers = ShardAnswers(config.shard_answers)
        self.meter = Meter()
        # store -> the positions its together reads merged (a rank read again at the same states merges none)
        self.together_reads: defaultdict[str, TogetherReads] = defaultdict(TogetherReads)
        # (global store, whether copies must be active) -> (the materializer's epoch, the
        # definition, its shards here when every copy may answer, else None)
        self._serving: dict[tuple[str, bool], tuple[int, StoreDefinition, list[Any] | None]] = {}
        # this node's Prometheus registry: its state read at each scrape, and the counters the
        # SQL front and the dispatcher keep as they answer (GET /metrics)
        self.metrics = Metrics()
        self.metrics.watch(self)
        self.materializer = Materializer(
            bootstrap, self.state_dir, on_change=self._wake.set, fetch_wait_ms=config.fetch_wait_ms,
            apply_linger_ms=config.apply_linger_ms,
            open_store=functools.partial(open_store, cache=self.scan_cache, meter=self.meter,
                                         kept=self.shard_answers if config.shard_answers > 0 else None))
        # Both topics are created again if they vanish (a broker restarted empty).
        self.catalog_tail = TopicTail(bootstrap, catalog_topic(app), self._on_catalog, self._on_catalog_reset,
                                      "catalog", COMPACTED, config.fetch_wait_ms)
        self.members_tail = TopicTail(bootstrap, nodes_topic(app), self._on_member, self.view.clear, "membership",
                                      COMPACTED, config.fetch_wait_ms)
        self.group = GroupMember(bootstrap, app, self._on_assignment, self._on_rebalancing, client_id=self.node_id,
                                 timings=config.group_timings, on_refused=self._refuse_because)
        # Not idempotent: an idempotent producer never recovers from a broker restarted empty.
        self._producer = kafka.producer(bootstrap, **{"enable.idempotence": False, "linger.ms": 0})
        self._loop_thread = threading.Thread(target=self._loop, name="heartbeat", daemon=True)

    # ---- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        self.duck  # DuckDB now, not at the first query: a bad --duckdb-memory-limit stops the start here
        if self.config.key_port is not None:  # bound now: a taken port stops the start here
            host = self.config.listen.rpartition(":")[0]
            self.key_server = KeyServer(self.read_local, self._topic_of, self.cluster_secret, host,
                                        self.config.key_port, self.tls, self.answer_call,
                                        watch=(self.answerable_offsets,
                                               functools.partial(self.materializer.wait_moved, hurry=False)))
            self.key_endpoint = f"{self.endpoint.rpartition(':')[0]}:{self.key_server.port}"
            self.key_server.start()
        kafka.check_reachable(self.config.bootstrap_servers)
        Catalog(self.config.bootstrap_servers, self.config.application_id, self.registry).ensure_topic()
        kafka.ensure_topic(kafka.admin(self.config.bootstrap_servers), nodes_topic(self.config.application_id), 1, COMPACTED)
        self.materializer.start()
        self.members_tail.start()
        self.catalog_tail.start()
        self._loop_thread.start()  # it joins the group once no other live process has our node id

    def stop(self) -> None:
        """Hand partitions over cleanly: say so, leave the group, remove our record. A node that
        refused to serve publishes nothing: the record under its id belongs to the live process."""
        self.state = "PENDING_SHUTDOWN"
        self._publish()
        if self._identity_checked.is_set():
            self.group.stop()
        self._stop.set()
        self._loop_thread.join(10)
        if self.refused is None and self._identity_checked.is_set():
            try:
                self._producer.produce(nodes_topic(self.config.application_id), key=self.node_id.encode(), value=None)
                self._producer.flush(5)
            except KafkaException as e:
                log.warning("could not remove this node's membership record: %s", e.args[0].str())
        if self.key_server is not None:
            self.key_server.stop()
        self.catalog_tail.stop()
        self.members_tail.stop()
        self.materializer.stop()
        if "_join_workers" in self.__dict__:
            self._join_workers.shutdown(wait=False)

    # ---- events from the threads -----------------------------------------------------------
    def catalog_read(self) -> bool:
        """Whether the catalog has been read to its end once: before, an unknown name may be a store."""
        return self.catalog_tail.caught_up.is_set()

    def _on_catalog(self, msg: Message) -> None:
        stores = dict(self.stores)
        if apply_catalog_message(stores, msg, self.registry, self.unusable_stores) is not None:
            self.stores = stores
            # a global store's changelog is read whole by every node: not the group's to assign
            self.group.subscribe(sorted({d.topic for d in stores.values() if not d.is_global}))
            self._wake.set()

    def _on_catalog_reset(self) -> None:
        # The subscription stays: the group notices the changelogs when they come back
        # (re-subscribing instead made a join wait for half a minute on tansu).
        self.stores = {}
        self._wake.set()

    def _on_member(self, msg: Message) -> None:
        if msg.key() is not None and msg.key().decode() == self.node_id:
            # Our own beats are in the view already; another process's records under our id
            # never enter it: they are checked (a dead predecessor's, or a live rival's).
            self._check_identity(msg.value())
            return
        # Only a peer whose routing changed wakes the loop: waking (and beating) on every beat
        # made the nodes echo each other's beats, about ten per second each.
        if self.view.apply(msg):
            self._wake.set()

    # ---- one live process per node id -----------------------------------------------------
    def _check_identity(self, value: bytes | None) -> None:
        if value is None:  # a tombstone: the process that held the id left cleanly (one that refuses writes none)
            self._rival = None
            return
        try:
            other = NodeInfo.from_json(value)
        except (ValueError, KeyError):
            return
        if other.incarnation == self.incarnation and other.started_ms == self.started_ms:
            return
        self._rival = other
        verdict = same_id(self._me(), other, time.time() * 1000)
        if verdict == "older":
            self._refuse(other)
        elif verdict == "newer" and other.incarnation not in self._warned:
            self._warned.add(other.incarnation)
            log.warning("another process at %s has started with this node id %r (incarnation %s); this node "
                        "keeps serving and that one refuses to", other.endpoint, self.node_id, other.incarnation)

    def _me(self) -> NodeInfo:
        return NodeInfo(self.node_id, self.endpoint, self.state, incarnation=self.incarnation, started_ms=self.started_ms,
                        key_endpoint=self.key_endpoint)

    def _refuse(self, other: NodeInfo) -> None:
        self._refuse_because(
            f"node id {self.node_id!r} is already used by a live node at {other.endpoint} in application "
            f"{self.config.application_id!r} (it started earlier, incarnation {other.incarnation or 'unknown'}); "
            "node ids are unique within an application: stop that node, or give this one another --node-id"
        )

    def _refuse_because(self, why: str) -> None:
        """Stop serving for good and say why (the process exits with REFUSED)."""
        if self.refused is not None:
            return
        self.state = "ERROR"
        self.refused = why
        log.error("refusing to serve: %s", self.refused)
        self._wake.set()
        self.on_refused(self.refused)

    def _await_identity(self) -> bool:
        """Before the first beat and the group join: wait until no other live process that
        started before us uses our node id. A record under our id from before a restart (a
        process that died) is waited out: it is gone once it has not beaten for
        SAME_ID_LIVE_SECONDS. A process that started after us refuses once it sees us beat.
        False: we refuse."""
        deadline = time.monotonic() + 10
        while not self.members_tail.caught_up.wait(0.1):
            if self._stop.is_set():
                return False
            if time.monotonic() > deadline:
                log.warning("the membership topic was not read to its end in 10 s; starting without the node id check")
                break
        while not self._stop.is_set() and self.refused is None:
            rival = self._rival
            if rival is None or same_id(self._me(), rival, time.time() * 1000) in ("gone", "newer"):
                return True
            self._stop.wait(0.1)
        return False

    def _on_assignment(self, partitions: set[tuple[str, int]]) -> None:
        self._assigned = frozenset(partitions)
        if self.state not in ("PENDING_SHUTDOWN", "ERROR"):  # a join finishing as the node leaves
            self.state = "RUNNING"
        self._wake.set()

    def _on_rebalancing(self) -> None:
        if self.state != "PENDING_SHUTDOWN":
            self.state = "REBALANCING"
        self._wake.set()

    # ---- reconcile and heartbeat -----------------------------------------------------------
    def _loop(self) -> None:
        if not self._await_identity():
            return
        self.group.start()
        self._identity_checked.set()
        next_beat = 0.0
        published: tuple | None = None  # our routing as of our last beat
        while not self._stop.is_set() and self.refused is None:
            self._wake.wait(max(0.0, next_beat - time.monotonic()))
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                if self.state == "CREATED" and self.catalog_tail.caught_up.is_set() and \
                        all(d.is_global for d in self.stores.values()):
                    self.state = "RUNNING"  # nothing to own yet
                self._reconcile()
                info = self.local_info()
                # beat on time, and at once when what peers route by has changed
                if time.monotonic() >= next_beat or info.routing() != published:
                    self._publish(info)
                    published = info.routing()
                    next_beat = time.monotonic() + HEARTBEAT_SECONDS
            except Exception:  # noqa: BLE001
                log.exception("reconcile/heartbeat failed")
                next_beat = time.monotonic() + HEARTBEAT_SECONDS

    def _roles(self) -> dict[tuple[str, int], str]:
        stores = self.stores
        topic_stores: dict[str, list[str]] = {}
        for d in stores.values():
            if not d.is_global:
                topic_stores.setdefault(d.topic, []).append(d.name)
        roles = {(s, p): ACTIVE for (t, p) in self._assigned for s in topic_stores.get(t, ())}
        # every partition of a global store, here as on every node: each answers it alone
        roles.update({(d.name, p): ACTIVE for d in stores.values() if d.is_global for p in range(d.partitions)})
        replicas = self.config.standby_replicas
        if replicas <= 0:
            return roles
        others = [n for n in self.view.live() if n.node_id != self.node_id]
        live_ids = [self.node_id, *(n.node_id for n in others)]
        for name, defn in stores.items():
            if defn.is_global:
                continue
            for p in range(defn.partitions):
                if (name, p) in roles:
                    continue
                owner = next((n.node_id for n in others if p in n.active.get(name, ())), None)
                if owner is None:
                    # Nobody claims it right now (a rebalance): keep a copy we have, it may serve stale reads.
                    if self.materializer.hosted(name, p) is not None:
                        roles[(name, p)] = STANDBY
                    continue
                if self.node_id in place_standbys(live_ids, owner, p, replicas):
                    roles[(name, p)] = STANDBY
        return roles

    def _reconcile(self) -> None:
        self.materializer.set_desired(self.stores, self._roles())

    def local_info(self) -> NodeInfo:
        info = NodeInfo(self.node_id, self.endpoint, self.state, timestamp_ms=int(time.time() * 1000),
                        incarnation=self.incarnation, started_ms=self.started_ms, key_endpoint=self.key_endpoint)
        stores = self.stores
        for (store, p), hs in sorted(self.materializer.snapshot().items()):
            defn = stores.get(store)
            held = info.global_copies if defn is not None and defn.is_global else \
                info.active if hs.role == ACTIVE else info.standby
            held.setdefault(store, []).append(p)
            if hs.shard.offset is not None:
                info.positions.setdefault(store, {})[p] = hs.shard.offset
            lag = hs.lag
            if lag is not None:
                info.lags.setdefault(store, {})[p] = lag
            if hs.role == ACTIVE and not hs.restored:
                info.restoring.setdefault(store, []).append(p)
        return info

    def answerable_offsets(self) -> tuple[int, dict[tuple[str, int], int]]:
        """(the materializer's epoch, (store, partition) -> offset applied, -1 for none) for
        every partition this node would answer now as the current active copy (as ``execute``
        decides for a caller that requires it); read again if the epoch moved meanwhile."""
        m = self.materializer
        while True:
            epoch = m.epoch
            out = {key: _offset(hs) for key, hs in m.snapshot().items() if _answerable(hs)}
            if m.epoch == epoch:
                return epoch, out

    def answerable_offsets_of(self, store: str, partitions: Iterable[int]) -> tuple[int, list[int]] | None:
        """(epoch, the offset of each of ``partitions``), as ``answerable_offsets`` gives them;
        None when this node would not answer one of them as the current active copy."""
        m = self.materializer
        epoch = m.epoch
        defn = self.stores.get(store)
        if defn is not None and defn.is_global:  # every copy is here: judged together, once an epoch
            shards = self._serving_copies(defn, require_active=True)
            if shards is None:
                return None
            offsets = [_shard_offset(shards[p]) for p in partitions]
        else:
            offsets = []
            for p in partitions:
                hs = m.hosted(store, p)
                if hs is None or not _answerable(hs):
                    return None
                offsets.append(_offset(hs))
        return (epoch, offsets) if m.epoch == epoch else None

    def local_lag(self, store: str, partition: int) -> int | None:
        """Records this node's copy of the partition is behind its changelog's end; None when
        it holds none or has not seen the end yet."""
        hs = self.materializer.hosted(store, partition)
        return None if hs is None else hs.lag

    def wait_applied(self, store: str, offsets: dict[int, int], deadline: float) -> None:
        """Until this node's copies of ``store``'s partitions have applied ``offsets`` (partition
        -> offset: a consistency token's), or until ``deadline`` (time.monotonic()): woken by
        each record applied, not polled."""
        m = self.materializer
        defn = self.stores.get(store)
        seen = m.wait_moved(-1, 0)
        while True:
            behind = [p for p, o in offsets.items()
                      if (hs := m.hosted(store, p)) is None or hs.shard.offset is None or hs.shard.offset < o]
            left = deadline - time.monotonic()
            if not behind or left <= 0:
                return
            # only these partitions' records are applied now; the others' gather on
            want = None if defn is None else {(defn.topic, p) for p in behind}
            seen = m.wait_moved(seen, min(left, 1.0), want=want)

    def _publish(self, info: NodeInfo | None = None) -> None:
        if self.refused is not None or not self._identity_checked.is_set():
            return  # the record under our id is another process's
        info = info or self.local_info()
        self.view.update_local(info)
        try:
            self._producer.produce(nodes_topic(self.config.application_id), key=self.node_id.encode(), value=info.to_json())
        except KafkaException as e:  # the topic is being created again; the next beat goes through
            log.warning("heartbeat not published: %s", e.args[0].str())
        self._producer.poll(0)

    # ---- what the HTTP layer asks ----------------------------------------------------------
    def schema_for(self, store: str) -> pa.Schema | None:
        defn = self.stores.get(store)
        return None if defn is None else defn.arrow_schema()

    def answer_call(self, raw: bytes) -> tuple[int, bytes]:
        """Another node's per-partition query over the call port: (status, the result stream or
        the JSON error body), as ``POST /internal/v1/query`` answers it."""
        try:
            return 200, internal_query.answer(self, self.registry.query_types, internal_query.parse_body(raw))
        except Exception as e:  # noqa: BLE001 - as the HTTP app answers: a bug is logged, and the caller told
            if not isinstance(e, FederatorError):
                log.exception("a per-partition query over the call port failed")
            err = as_error(e)
            return err.status, err.to_json()

    def execute(self, request: StateQueryRequest) -> list[QueryResult]:
        results = self._execute(request)
        if request.bound.position is None:  # no consistency token: nothing to wait for
            return results
        behind = _behind(request.bound.position, self.stores.get(request.store), results)
        if behind:
            # a token's read (often another node's) for records fetched or about to be: applied
            # now, not after the linger, and answered, rather than refused and asked again when
            # this node's positions watch tells the caller
            self.wait_applied(request.store, behind, time.monotonic() + TOKEN_WAIT_S)
            results = self._execute(request)
        return results

    def _execute(self, request: StateQueryRequest) -> list[QueryResult]:
        defn = self.stores.get(request.store)
        partitions = request.partitions if request.partitions is not None else range(defn.partitions if defn else 0)
        together = _together_handler(request, defn)
        if together is not None and defn is not None:
            return self._answer_together(request, defn, list(partitions), together)
        run = _Execution(followable=(request.work is not None and request.work.sql is not None
                                     and request.work.join is None and self.scan_cache is not None
                                     and not request.collect_execution_info))
        for p in partitions:
            hs, refused = self._copy_for(request.store, defn, p, request.require_active)
            if hs is None:
                run.results.append(refused)
            elif run.followable and hs.shard.base.store_type.is_full_scan(request.query):  # a kept result is of all rows
                run.deferred.append((len(run.results), p, hs.shard))
                run.results.append(None)  # filled by _finish
            else:
                run.results.append(self._run_partition(request, hs, run))
        return self._finish(request, run)

    def unchanged_since(self, store: str, query: Query, since: Position) -> bool:
        """Whether a global store's ``query`` answers now, from this node's current copies,
        what it answered at the offsets ``since`` names; False when its store type cannot
        tell, or a copy is not current."""
        defn = self.stores.get(store)
        follower = defn.store_type.together_followers.get(type(query)) if defn is not None and defn.is_global else None
        if follower is None:
            return False
        # a copy that may not answer as the current one (_copy_for's refusals) cannot say
        shards = self._serving_copies(defn, require_active=True)
        if shards is None:
            return False
        offsets = [-1 if (o := since.get(defn.topic, p)) is None else o for p in range(defn.partitions)]
        # nor can a copy behind ``since``: not the one that answered then (a changelog created again)
        if any(_shard_offset(s) < o for s, o in zip(shards, offsets)):
            return False
        return unchanged_since(shards, query, offsets, follower)

    def _copy_for(self, store: str, defn: StoreDefinition | None, p: int,
                  require_active: bool) -> tuple[HostedShard, None] | tuple[None, QueryResult]:
        """This node's copy of partition ``p`` that may answer a read, or why none does."""
        if defn is None or not 0 <= p < defn.partitions:
            what = f"store {store!r}" if defn is None else f"partition {p} of store {store!r}"
            return None, QueryResult.failed(p, FailureReason.DOES_NOT_EXIST, f"{what} does not exist")
        hs = self.materializer.hosted(store, p)
        if _serves(hs, require_active):
            return hs, None
        if hs is None:
            return None, QueryResult.failed(
                p, FailureReason.NOT_PRESENT,
                f"node {self.node_id} does not host partition {p} of store {store!r}; "
                "GET /v1/metadata names its owner")
        if hs.gone:
            return None, QueryResult.failed(
                p, FailureReason.DOES_NOT_EXIST,
                f"the changelog {hs.shard.topic!r} of store {store!r} no longer exists")
        # A copy that never reached its log end is no answer at all, even a stale one.
        if not hs.caught_up:
            why = f"a copy still restoring (lag {hs.lag})"
        elif hs.role != ACTIVE:
            why = "a standby copy"
        else:
            why = f"an active copy that is catching up (lag {hs.lag})"
        return None, QueryResult.failed(
            p, FailureReason.NOT_ACTIVE, f"node {self.node_id} holds partition {p} of store {store!r} as {why}")

    def _run_partition(self, request: StateQueryRequest, hs: HostedShard, run: _Execution) -> QueryResult:
        """One partition's query on its copy; the owner's work over it noted in ``run`` (the
        joins and the pushed-down SQL run over all partitions at once), or a projection done."""
        work = request.work
        result = hs.shard.run(request.query, request.bound, request.collect_execution_info)
        at = len(run.results)
        if work is not None and result.ok and work.join is not None:
            joined_defn = self.stores.get(work.join)
            if joined_defn is not None and joined_defn.is_global:
                if run.broadcast is None:  # read once for all of this request's partitions
                    run.broadcast = self._global_rows(request, joined_defn)
                result = _beside(result, run.broadcast)
                if result.ok:
                    run.joined.append((at, hs.shard.base, None, None))
            else:
                result, other_rows, other_shard = self._join_side(request, work.join, result)
                if other_rows is not None:
                    run.joined.append((at, hs.shard.base, other_rows, other_shard))
        elif work is not None and result.ok:
            if work.sql is not None:
                run.owned.append((at, hs.shard.base))
            else:
                result = _project(list(work.columns), result)
        return result

    def _finish(self, request: StateQueryRequest, run: _Execution) -> list[QueryResult]:
        """The deferred partitions answered (following a kept result, else read), then the
        joins and the pushed-down SQL over all partitions at once."""
        results = run.results
        sql = request.work.sql if request.work is not None else None
        if run.deferred and sql is not None:  # deferred only when followable: work with its SQL
            followed = followed_answer(sql, [(p, store) for _, p, store in run.deferred], request.bound, self.scan_cache)
            for n, (i, p, store) in enumerate(run.deferred):
                if followed is not None:
                    results[i] = followed[n]
                    continue
                result = results[i] = store.run(request.query, request.bound)
                if result.ok:
                    run.owned.append((i, store.base))
        answered = [r for r in results if r is not None]
        assert len(answered) == len(results), "every deferred partition is answered"
        if run.joined:
            self._join(request, [(answered[i], shard, rows, other) for i, shard, rows, other in run.joined],
                       run.broadcast[0] if isinstance(run.broadcast, tuple) else None)
        if run.owned and sql is not None:  # owned only for work with its SQL
            owners_sql(self.duck, sql, [(answered[i], shard) for i, shard in run.owned], self.scan_cache)
        return answered

    def read_together(self, store: str, query: Query, require_active: bool) -> QueryResult | None:
        """A global store's ``query`` answered by its store type from this node's copies of
        every partition at once: the result holds the rows and the Position it read of each.
        None when the store is not global here, its type does not answer ``query`` so, or a
        copy may not answer now (``execute`` then says why)."""
        defn = self.stores.get(store)
        handler = defn.store_type.together_handlers.get(type(query)) if defn is not None and defn.is_global else None
        shards = self._serving_copies(defn, require_active) if handler is not None else None
        if shards is None:
            return None
        results = self._read_shards_together(defn, shards, query, UNBOUNDED, handler)
        return results[0] if results[0].ok else None

    def _read_shards_together(self, defn: StoreDefinition, shards: list[Any], query: Query, bound: PositionBound,
                              handler: TogetherHandler) -> list[QueryResult]:
        started = time.perf_counter_ns()
        results = answer_together(shards, query, bound, handler, self.together_reads[defn.name])
        count(self.meter.table(defn.name, 0), query, results[0], time.perf_counter_ns() - started)
        return results

    def _answer_together(self, request: StateQueryRequest, defn: StoreDefinition, partitions: list[int],
                         handler: TogetherHandler) -> list[QueryResult]:
        """A global store's query answered from all of its partitions here at once."""
        if sorted(partitions) != list(range(defn.partitions)):
            return [QueryResult.failed(p, FailureReason.NOT_ACTIVE,
                                       f"a {request.query.type_name} reads every partition of store {defn.name!r} "
                                       f"at once; it was asked for partitions {sorted(partitions)}")
                    for p in partitions]
        shards = self._serving_copies(defn, request.require_active)
        if shards is None:
            copies = [self._copy_for(request.store, defn, p, request.require_active) for p in partitions]
            refused = [r for _, r in copies if r is not None]
            if refused:
                return refused + [together_refused(hs.shard.partition, refused[0]) for hs, r in copies if r is None]
            shards = [hs.shard.base for hs, _ in copies]  # each became current since: the next epoch's
        results = self._read_shards_together(defn, shards, request.query, request.bound, handler)
        if request.work is not None:  # only columns to keep (_together_handler)
            results = [_project(list(request.work.columns), r) if r.ok else r for r in results]
        return results

    def _serving_copies(self, defn: StoreDefinition, require_active: bool) -> list[Any] | None:
        """The shards of every partition of global store ``defn`` here when each copy may answer
        a read (``_serves``), else None: worked out again only when the materializer's epoch
        moves, as it does when a copy opens, closes, resets, becomes current or stops being so."""
        epoch = self.materializer.epoch  # read first: a change while this looks is a new epoch
        kept = self._serving.get((defn.name, require_active))
        if kept is not None and kept[0] == epoch and kept[1] is defn:
            return kept[2]
        hosted = [self.materializer.hosted(defn.name, p) for p in range(defn.partitions)]
        shards = [hs.shard.base for hs in hosted] if all(_serves(hs, require_active) for hs in hosted) else None
        self._serving[(defn.name, require_active)] = (epoch, defn, shards)
        return shards

    def _join_side(self, request: StateQueryRequest, other: str,
                   left: QueryResult) -> tuple[QueryResult, pa.RecordBatch | None, Any]:
        """Partition p of ``other`` beside partition p of the request's store, which this node
        must hold as it holds the first (else NOT_COLOCATED: the receiver joins)."""
        p = left.partition
        hs = self.materializer.hosted(other, p)
        if hs is None or hs.gone or not hs.caught_up or (request.require_active and (hs.role != ACTIVE or not hs.restored)):
            return QueryResult.failed(p, FailureReason.STORE_EXCEPTION,
                                      f"node {self.node_id} does not hold partition {p} of {other!r} beside "
                                      f"{request.store!r}", code="NOT_COLOCATED"), None, None
        right = hs.shard.run(request.query, request.bound)
        if not right.ok:
            return right, None, None
        left.position = left.position.merge(right.position)
        return left, right.batch, hs.shard.base

    def _global_rows(self, request: StateQueryRequest, defn: StoreDefinition) -> tuple[pa.Table, Position] | QueryResult:
        """Every row of the global store ``defn`` from this node's copies, with their positions,
        or the first partition's failure; read as ``request`` must read (its bound, a current
        copy unless any will do)."""
        query = defn.store_type.full_scan_query()
        batches: list[pa.RecordBatch] = []
        positions: list[Position] = []
        for p in range(defn.partitions):
            hs = self.materializer.hosted(defn.name, p)
            if hs is None or hs.gone or not hs.caught_up or (request.require_active and not hs.restored):
                return QueryResult.failed(p, FailureReason.STORE_EXCEPTION,
                                          f"node {self.node_id} does not hold partition {p} of global store "
                                          f"{defn.name!r} ready to join yet", code="NOT_COLOCATED")
            r = hs.shard.run(query, request.bound)
            if not r.ok:
                return r
            batches.append(r.batch)
            if r.position is not None:
                positions.append(r.position)
        return pa.Table.from_batches(batches, defn.arrow_schema()), Position().merge_all(positions)

    def _join(self, request: StateQueryRequest, parts: list[tuple[QueryResult, Any, pa.RecordBatch | None, Any]],
              broadcast: pa.Table | None = None) -> None:
        """A co-partitioned join of this node's partitions (each: the left result, its shard,
        the right rows, their shard), or a join of them with a global store's rows
        (``broadcast``, read once). A key lives in one partition of each store, so joining
        all of them at once pairs the same rows as joining partition by partition, for one
        DuckDB statement's fixed cost instead of one per partition. As a key lookup in Arrow
        when the planner sent one (federator.owner.keyjoin), else as DuckDB's join. The answer
        rides on the first partition; the others carry no rows."""
        work = request.work
        assert work is not None, "a join is the owners' work"
        try:
            if broadcast is not None:
                assert work.sql is not None, "a join with a global store runs its SQL"
                batch = self.duck.over(work.sql, {
                    LEFT: pa.Table.from_batches([r.batch for r, _, _, _ in parts]),
                    RIGHT: broadcast})
            elif work.key_join is not None:
                query = request.query  # a range comes in key order (and a key is one row)
                in_key_order = isinstance(query, KeyQuery) or (isinstance(query, RangeQuery) and not query.descending)
                batch = keyjoin.run(work.key_join, self.duck,
                                    [(r.batch, rows, shard, other) for r, shard, rows, other in parts],
                                    self._join_workers, in_key_order, self.scan_cache)
            else:
                assert work.sql is not None, "a join without a key lookup runs its SQL"
                batch = self.duck.over(work.sql, {
                    LEFT: pa.Table.from_batches([r.batch for r, _, _, _ in parts]),
                    RIGHT: pa.Table.from_batches([rows for _, _, rows, _ in parts])})
        except SqlError as e:
            for r, _, _, _ in parts:
                r.batch, r.failure, r.message, r.code = None, FailureReason.STORE_EXCEPTION, e.message, e.code
            return
        empty = pa.RecordBatch.from_pylist([], schema=batch.schema)
        for i, (r, _, _, _) in enumerate(parts):
            r.batch = batch if i == 0 else empty

    @functools.cached_property
    def _join_workers(self) -> ThreadPoolExecutor:
        """Threads for the per-partition part of a key join, as many as DuckDB's (the cores
        it is given): Arrow's compute and DuckDB release the GIL."""
        return ThreadPoolExecutor(self.duck.config.threads, thread_name_prefix="key-join")

    def _topic_of(self, store: str) -> str | None:
        defn = self.stores.get(store)
        return None if defn is None else defn.topic

    def read_local(self, store: str, partition: int, key: bytes, bound: PositionBound) -> StoredEntry | None:
        """A key's stored entry from this node's active, current copy, asked down the store's
        layers as a LocalKeyQuery; None when this node cannot serve it that way (the caller
        routes it like any query)."""
        hs = self.materializer.hosted(store, partition)
        if hs is None or hs.gone or not hs.caught_up or hs.role != ACTIVE or not hs.restored:
            return None
        return hs.shard.run(LocalKeyQuery(key), bound)

    # ---- DuckDB and metadata ---------------------------------------------------------------
    @functools.cached_property
    def duck(self) -> Duck:
        """This node's DuckDB: the owners' per-partition SQL and the receiver's whole statements."""
        return Duck(DuckConfig(memory_limit=self.config.duckdb_memory_limit, spill_dir=self.state_dir / "spill"))

    def metadata(self) -> dict[str, Any]:
        view = self.view.to_public()
        view["node_id"] = self.node_id
        view["application_id"] = self.config.application_id
        view["stores"] = {
            name: {"partitions": d.partitions, "topic": d.topic, "type": d.type, "scope": d.scope}
            for name, d in sorted(self.stores.items())
        }
        view["local"] = {
            "records_applied": {
                f"{store}/{p}": hs.applied for (store, p), hs in sorted(self.materializer.snapshot().items())
            },
            "scan_cache": self.scan_cache.stats(),
            "kept_answers": self.shard_answers.stats(),
            "store_queries": self.meter.stats(),
        }
        return view

    def key_metadata(self, store: str, key: str) -> dict[str, Any]:
        defn = self.stores.get(store)
        if defn is None:
            raise KeyError(f"no store {store!r}; GET /v1/metadata lists the stores")
        kb = defn.key.serialize(defn.key.parse(key))
        p = partition_for(kb, defn.partitions)
        # a global store's key is answered by whichever node is asked: this one, once it holds it
        owner = (self.view.get(self.node_id) if self.materializer.hosted(store, p) is not None else None) \
            if defn.is_global else self.view.active_owner(store, p)
        return {
            "store": store,
            "key": key,
            "partition": p,
            "scope": defn.scope,
            "active": None if owner is None else {"node_id": owner.node_id, "endpoint": owner.endpoint},
            "standbys": [
                {"node_id": n.node_id, "endpoint": n.endpoint, "lag": n.lags.get(store, {}).get(p)}
                for n in self.view.standbys(store, p)
            ],
        }

    def ready(self) -> tuple[bool, list[str]]:
        reasons = []
        if self.refused is not None:
            reasons.append(self.refused)
        elif not self._identity_checked.is_set():
            reasons.append(f"checking that no other live process uses the node id {self.node_id!r}")
        if self.state != "RUNNING":
            reasons.append(f"state is {self.state}")
        hosted = self.materializer.snapshot()
        for (store, p), role in sorted(self._roles().items()):  # a global store's copies too
            hs = hosted.get((store, p))
            if role != ACTIVE:
                continue
            if hs is None or hs.role != ACTIVE:
                reasons.append(f"store {store} partition {p} is being opened")
            elif not hs.restored:
                reasons.append(f"store {store} partition {p} is restoring (lag {hs.lag})")
        return not reasons, reasons
