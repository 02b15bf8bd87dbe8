"""A node's SQL front: what the HTTP routes and Flight SQL ask of it (statements, the stores
with their SQL types, a routed key lookup), over the node's stores and cluster view.

It lives above the node (the node answers per-partition queries and knows nothing of SQL);
``federator node`` builds one beside the node and hands it to the servers.
"""

from __future__ import annotations

from typing import Any

from federator.catalog.definition import StoreDefinition
from federator.errors import SqlError
from federator.metrics import Metrics
from federator.node.protocol import ServingNode
from federator.plugin.registry import Registry
from federator.sql.engine import RoutedPoint, SqlEngine
from federator.sql.limits import Admission, Limits
from federator.sql.result import SqlRequest, SqlResult
from federator.sql.types import sql_type


class SqlService:
    def __init__(self, node: ServingNode, registry: Registry) -> None:
        self.node = node
        self.metrics: Metrics = node.metrics  # the node's (its registry, served at GET /metrics)
        self.engine = SqlEngine(node, registry, self.metrics)
        # the caps of the public entries (the node's flags) and their one count of running
        # queries, shared by HTTP and Flight SQL
        self.limits = Limits.of(node.config)
        self.admission = Admission.of(self.limits)

    @property
    def stores(self) -> dict[str, StoreDefinition]:
        return self.node.stores

    def sql(self, request: SqlRequest) -> SqlResult:
        return self.engine.execute(request)

    def stores_info(self) -> list[dict[str, Any]]:
        return [
            {**d.to_dict(), "scope": d.scope,
             "columns": [{"name": f.name, "type": sql_type(f.type)} for f in d.arrow_schema()]}
            for _, d in sorted(self.stores.items())
        ]

    def store_info(self, name: str) -> dict[str, Any]:
        defn = self.engine.resolve_store(name)
        info = next(s for s in self.stores_info() if s["name"] == defn.name)
        view = self.node.view
        parts: list[dict[str, Any]] = []
        for p in range(defn.partitions):
            if defn.is_global:  # no owner: every node keeps a copy and answers from it
                parts.append({"partition": p, "active": None, "standbys": [], "copies": [
                    {"node_id": n.node_id, "endpoint": n.endpoint, "lag": n.lags.get(defn.name, {}).get(p),
                     "position": n.positions.get(defn.name, {}).get(p)}
                    for n in view.live() if p in n.global_copies.get(defn.name, ())]})
                continue
            owner = view.active_owner(defn.name, p)
            parts.append({
                "partition": p,
                "active": None if owner is None else {
                    "node_id": owner.node_id, "endpoint": owner.endpoint,
                    "lag": owner.lags.get(defn.name, {}).get(p), "position": owner.positions.get(defn.name, {}).get(p),
                },
                "standbys": [
                    {"node_id": n.node_id, "endpoint": n.endpoint, "lag": n.lags.get(defn.name, {}).get(p)}
                    for n in view.standbys(defn.name, p)
                ],
            })
        info["partition_owners"] = parts
        return info

    def answer_now(self, request: SqlRequest) -> SqlResult | RoutedPoint | None:
        """``sql``'s answer when this node has it at once, or what reads a point query's key
        from its owner elsewhere on the event loop (SqlEngine.answer_now); None when neither."""
        return self.engine.answer_now(request)

    def lookup(self, store: str, key: str) -> SqlResult:
        """A routed point lookup of ``key`` (given as its string form): the answer of the SQL
        point query, so the REST lookup takes the SQL point path (no row: no such key)."""
        return self.sql(self._lookup_request(store, key))

    def lookup_now(self, store: str, key: str) -> SqlResult | RoutedPoint | None:
        """``lookup``'s answer when this node reads the key from its own copy at once, or what
        reads it from the key's owner elsewhere on the event loop (SqlEngine.point_now); None
        when neither."""
        return self.engine.point_now(self._lookup_request(store, key))

    def _lookup_request(self, store: str, key: str) -> SqlRequest:
        defn = self.engine.resolve_store(store)
        try:
            value = defn.key.parse(key)
        except ValueError as e:
            raise SqlError("INVALID_PARAMETER", f"key {key!r} is not a {defn.key_format}: {e}") from None
        return SqlRequest(f'SELECT * FROM "{defn.name}" WHERE "{defn.key_name}" = ?', [value])
