"""A node's Prometheus metrics: one ``CollectorRegistry`` per node (never prometheus_client's
global one: a process may hold many nodes and apps, as the tests do), served at ``GET /metrics``.

Two kinds of series:

* what the query path counts as it goes (``Metrics.query``, ``Metrics.internal_call``,
  ``Metrics.loop_request``): the SQL statements this node answered, by kind and outcome, with
  their latency, its calls to other nodes, by peer and outcome, and how the event-loop HTTP
  server answered its hot routes. The SQL engine and the dispatcher are handed the node's
  ``Metrics`` (they import nothing of this module); each update is a dict lookup of the
  labelled children, kept here, and prometheus_client's own increments.
* what the node's state is, read at scrape time by ``NodeCollector`` and never updated on the
  hot path: partitions by state in the cluster view, this node's copies with their lag and the
  records they applied, the scan cache, the store queries the metering layer counts, DuckDB's
  memory.

docs/reference/metrics.md lists every series; docs/grafana-dashboard.json charts them.
"""

from __future__ import annotations

import logging
from typing import Any, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

# SQL statements by what they read; the engine classifies them (federator.sql.engine.plan_kind)
QUERY_KINDS = ("point", "scan", "aggregate", "join", "plugin", "other", "unknown")
OK = "ok"
# a point lookup answers in ~150 us; a scan of many partitions in seconds
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                   1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    """The node's registry and the counters of its query path."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._queries = Counter(
            "federator_sql_queries", "SQL statements this node answered, by kind and outcome (ok, or the error code)",
            ("kind", "outcome"), registry=self.registry)
        self._latency = Histogram(
            "federator_sql_query_duration_seconds", "Time to answer a SQL statement at this node, by kind",
            ("kind",), buckets=LATENCY_BUCKETS, registry=self.registry)
        self._calls = Counter(
            "federator_internal_calls", "Calls this node made to other nodes, by peer node, call and outcome",
            ("peer", "call", "outcome"), registry=self.registry)
        self._call_latency = Histogram(
            "federator_internal_call_duration_seconds", "Time of this node's calls to other nodes, by call",
            ("call",), buckets=LATENCY_BUCKETS, registry=self.registry)
        self._loop_requests = Counter(
            "federator_loop_server_requests", "SQL statements and key lookups the event-loop HTTP server was "
            "asked, by route and how it answered them: at once on its loop, on its loop after reading the key "
            "from its owner, or on its threads", ("route", "answered"), registry=self.registry)
        # labelled children resolved once: .labels() takes a lock and builds a tuple per call
        self._query_children: dict[tuple[str, str], tuple[Any, Any]] = {}
        self._call_children: dict[tuple[str, str, str], tuple[Any, Any]] = {}
        self._loop_children: dict[tuple[str, str], Any] = {}

    def query(self, kind: str, outcome: str, seconds: float) -> None:
        """One SQL statement answered (``outcome`` "ok") or failed (its SqlError code)."""
        children = self._query_children.get((kind, outcome))
        if children is None:
            children = self._query_children.setdefault(
                (kind, outcome), (self._queries.labels(kind, outcome), self._latency.labels(kind)))
        children[0].inc()
        children[1].observe(seconds)

    def internal_call(self, peer: str, call: str, outcome: str, seconds: float) -> None:
        """One call to node ``peer`` (``call``: "query" or "key"), and how it ended."""
        children = self._call_children.get((peer, call, outcome))
        if children is None:
            children = self._call_children.setdefault(
                (peer, call, outcome), (self._calls.labels(peer, call, outcome), self._call_latency.labels(call)))
        children[0].inc()
        children[1].observe(seconds)

    def loop_request(self, route: str, answered: str) -> None:
        """One request of a hot route (``route``: "sql" or "lookup") to the event-loop HTTP
        server, ``answered`` "at_once", "from_owner" or "threads"."""
        child = self._loop_children.get((route, answered))
        if child is None:
            child = self._loop_children.setdefault((route, answered), self._loop_requests.labels(route, answered))
        child.inc()

    def watch(self, node: Any) -> None:
        """Report ``node``'s state at each scrape (see NodeCollector)."""
        self.registry.register(NodeCollector(node))


def _gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


def _counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, labels=list(labels))


class NodeCollector(Collector):
    """The node's state as gauges and counters, read when Prometheus scrapes. ``node`` is
    duck-typed: what it lacks (a fake node in a test) is left out."""

    def __init__(self, node: Any) -> None:
        self.node = node

    def describe(self) -> list[Metric]:
        return []  # the series depend on the node's stores; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        for part in (self._node, self._partitions, self._copies, self._scan_cache, self._shard_answers, self._store_queries, self._duckdb):
            try:
                yield from part()
            except Exception:  # noqa: BLE001 - one unreadable part must not lose the others
                log.exception("metrics: could not read %s", part.__name__)

    def _node(self) -> Iterator[Metric]:
        node = self.node
        info = _gauge("federator_node_info", "This node: its id and state (always 1)", ("node_id", "state"))
        info.add_metric([str(node.node_id), str(node.state)], 1)
        yield info
        view = getattr(node, "view", None)
        if view is not None:
            yield GaugeMetricFamily("federator_live_nodes", "Live nodes in this node's cluster view",
                                    value=len(view.live()))

    def _partitions(self) -> Iterator[Metric]:
        """Each partition of each store once, by its state in the cluster view."""
        view, stores = getattr(self.node, "view", None), getattr(self.node, "stores", None)
        if view is None or stores is None:
            return
        states = _gauge("federator_partitions",
                        "Partitions of each store by state in the cluster view: active (an active owner, "
                        "current), restoring (an active owner still restoring), uncovered (no live node "
                        "serves it actively); they sum to the store's partition count", ("store", "state"))
        standbys = _gauge("federator_partition_standbys", "Standby copies of each store's partitions in the "
                          "cluster view", ("store",))
        scopes = _gauge("federator_store_info", "Each store: its type and scope (global: every node keeps every "
                        "partition and answers it alone; partitioned: each partition on its owner); always 1",
                        ("store", "type", "scope"))
        global_copies = _gauge("federator_global_copies", "Copies of a global store's partitions on the live "
                               "nodes of the cluster view (its partitions times the nodes, once all have restored)",
                               ("store",))
        live = view.live()
        for name, defn in sorted(stores.items()):
            scopes.add_metric([name, defn.type, defn.scope], 1)
            counts = {"active": 0, "restoring": 0, "uncovered": 0}
            copies = 0
            for p in range(defn.partitions):
                if defn.is_global:  # active: some node holds a current copy (each answers from its own)
                    held = [n for n in live if p in n.global_copies.get(name, ())]
                    copies += len(held)
                    current = [n for n in held if p not in n.restoring.get(name, ())]
                    counts["active" if current else "restoring" if held else "uncovered"] += 1
                    continue
                owner = next((n for n in live if p in n.active.get(name, ())), None)
                if owner is None:
                    counts["uncovered"] += 1
                elif p in owner.restoring.get(name, ()):
                    counts["restoring"] += 1
                else:
                    counts["active"] += 1
                copies += sum(1 for n in live if p in n.standby.get(name, ()))
            for state, n in counts.items():
                states.add_metric([name, state], n)
            (global_copies if defn.is_global else standbys).add_metric([name], copies)
        yield from (states, standbys, scopes, global_copies)

    def _copies(self) -> Iterator[Metric]:
        """The partitions this node hosts: their role, lag, restore and the records applied."""
        materializer = getattr(self.node, "materializer", None)
        if materializer is None:
            return
        hosted = materializer.snapshot()
        stores = getattr(self.node, "stores", {})
        mine = _gauge("federator_node_partitions", "Partitions this node hosts, by state (active, restoring, "
                      "standby, global: a current copy of a global store's)", ("store", "state"))
        lag = _gauge("federator_partition_lag_records", "Records this node's copy is behind its changelog's end",
                     ("store", "partition", "role"))
        restored = _gauge("federator_partition_restored", "1 when this node's copy has caught up with its "
                          "changelog since it was assigned, 0 while it restores (its lag is what is left)",
                          ("store", "partition", "role"))
        applied = _counter("federator_records_applied", "Changelog records this node applied to its copy since "
                           "it opened it", ("store", "partition"))
        counts: dict[tuple[str, str], int] = {}
        for (store, p), hs in sorted(hosted.items()):
            if hs.gone:
                continue
            defn = stores.get(store)
            role = "global" if defn is not None and defn.is_global else str(hs.role)
            state = role if role == "standby" or hs.restored else "restoring"
            counts[(store, state)] = counts.get((store, state), 0) + 1
            labels = [store, str(p), role]
            if hs.lag is not None:
                lag.add_metric(labels, hs.lag)
            restored.add_metric(labels, 1 if hs.restored else 0)
            applied.add_metric([store, str(p)], hs.applied)
        for (store, state), n in sorted(counts.items()):
            mine.add_metric([store, state], n)
        yield from (mine, lag, restored, applied)

    def _scan_cache(self) -> Iterator[Metric]:
        cache = getattr(self.node, "scan_cache", None)
        if cache is None:
            return
        s = cache.stats()
        yield GaugeMetricFamily("federator_scan_cache_entries", "Full scans kept in the scan cache", value=s["entries"])
        yield GaugeMetricFamily("federator_scan_cache_derived_entries", "Results derived from kept scans (the "
                                "owners' work) kept in the scan cache", value=s["derived"])
        yield GaugeMetricFamily("federator_scan_cache_bytes", "Bytes the scan cache holds", value=s["bytes"])
        yield GaugeMetricFamily("federator_scan_cache_max_bytes", "The scan cache's budget (--scan-cache-mb)",
                                value=s["max_bytes"])
        yield CounterMetricFamily("federator_scan_cache_hits", "Full scans answered from the scan cache",
                                  value=s["hits"])
        yield CounterMetricFamily("federator_scan_cache_misses", "Full scans the scan cache could not answer",
                                  value=s["misses"])
        yield CounterMetricFamily("federator_scan_cache_followed", "Kept scans brought up to date from the "
                                  "writes since", value=s["followed"])
        yield CounterMetricFamily("federator_scan_cache_maintained", "Owners' kept partial aggregates brought up "
                                  "to date from the rows written since", value=s["maintained"])

    def _shard_answers(self) -> Iterator[Metric]:
        kept = getattr(self.node, "shard_answers", None)
        if kept is None:
            return
        s = kept.stats()
        yield CounterMetricFamily("federator_kept_answers_hits", "Store queries answered from the answer the "
                                  "partition computed at the same write sequence (--shard-answers)", value=s["hits"])
        yield CounterMetricFamily("federator_kept_answers_computed", "Store queries the shard-answer layer "
                                  "passed down to compute", value=s["computed"])

    def _store_queries(self) -> Iterator[Metric]:
        meter = getattr(self.node, "meter", None)
        if meter is None:
            return
        labels = ("store", "query_type")
        queries = _counter("federator_store_queries", "Queries this node's store copies answered, by query type",
                           labels)
        rows = _counter("federator_store_rows", "Rows this node's store copies answered", labels)
        failed = _counter("federator_store_failed_queries", "Queries this node's store copies failed", labels)
        seconds = _counter("federator_store_query_seconds", "Time this node's store copies spent answering",
                           labels)
        for store, by_type in meter.stats().items():
            for query_type, c in by_type.items():
                queries.add_metric([store, query_type], c["queries"])
                rows.add_metric([store, query_type], c["rows"])
                failed.add_metric([store, query_type], c["failed"])
                seconds.add_metric([store, query_type], c["ms"] / 1000)
        yield from (queries, rows, failed, seconds)

    def _duckdb(self) -> Iterator[Metric]:
        # the node makes its DuckDB on first use (a cached property): a scrape must not make it
        duck = vars(self.node).get("duck") if hasattr(self.node, "__dict__") else None
        if duck is None or not hasattr(duck, "memory"):
            return
        used, spilled = duck.memory()
        yield GaugeMetricFamily("federator_duckdb_memory_bytes", "Memory DuckDB holds (its buffer manager)",
                                value=used)
        yield GaugeMetricFamily("federator_duckdb_temporary_storage_bytes", "What DuckDB spilled to disk",
                                value=spilled)
