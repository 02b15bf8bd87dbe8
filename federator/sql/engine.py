"""The SQL front door of a node: parse → plan → route → dispatch → merge."""

from __future__ import annotations

import time
from typing import Any

import pyarrow as pa

from federator.catalog.definition import StoreDefinition
from federator.dispatch.dispatcher import Dispatcher
from federator.merge.merge import finish
from federator.query.position import Position, PositionBound
from federator.sql.catalog_tables import CATALOG, SCHEMA, describe, information_schema, show_tables
from federator.sql.errors import SqlError
from federator.sql.parse import Statement, parse
from federator.sql.pipeline import run
from federator.partitioner import partition_for
from federator.plan.keys import SubQuery
from federator.query.queries import KeyQuery
from federator.sql.planner import SelectPlan, bind_parameters, plan_select
from federator.plugin.manager import sql_rules
from federator.plugin.rules import RulePlan, SqlRule, first_plan
from federator.sql.point import PointAnswer, PointPlan, point_plan
from federator.sql.result import SqlRequest, SqlResult


def _plan_key(req: SqlRequest) -> tuple | None:
    """What a store query's plan depends on besides the store: the SQL text and the parameters
    with their types (1 and True hash alike, and bind differently); None when some parameter
    cannot be a key."""
    key = (req.sql, tuple((type(p), p) for p in req.parameters))
    try:
        hash(key)
    except TypeError:
        return None
    return key


class SqlEngine:
    def __init__(self, node: Any) -> None:
        self.node = node
        self.dispatcher = Dispatcher(node)
        self._points: dict[str, PointPlan | None] = {}  # SQL text -> its point plan (None: not a point lookup)
        # (SQL text, parameters) -> a store query's plan and its pipeline as sent: planning costs
        # more than answering a repeated aggregate over kept scans
        self._plans: dict[tuple, tuple[SelectPlan, dict[str, Any]]] = {}

    def _stores(self) -> dict[str, StoreDefinition]:
        return self.node.stores

    def resolve_store(self, name: str) -> StoreDefinition:
        """The store called ``name`` (case-insensitively), or UNKNOWN_STORE saying what there is."""
        stores = self._stores()
        defn = stores.get(name) or next((d for n, d in stores.items() if n.lower() == name.lower()), None)
        unusable = getattr(self.node, "unusable_stores", {})
        if defn is None and name in unusable:
            raise SqlError("UNKNOWN_STORE", f"this node cannot read store {name!r}: {unusable[name]}; "
                                            "install what it needs on every node, or send the query to a node that has it")
        if defn is None:
            known = ", ".join(sorted(stores)) or "none yet"
            raise SqlError("UNKNOWN_STORE", f"unknown store {name!r}; stores are: {known} (SHOW TABLES lists them)")
        return defn

    def execute(self, req: SqlRequest) -> SqlResult:
        started = time.perf_counter()
        deadline = time.monotonic() + req.timeout_ms / 1000
        try:
            position = Position.from_token(req.consistency_token) if req.consistency_token else Position()
        except ValueError as e:
            raise SqlError("INVALID_PARAMETER", str(e)) from None
        stmt = parse(req.sql)
        stats: dict[str, Any] = {"partitions_queried": 0, "nodes": 0, "rows": 0, "elapsed_ms": 0.0}
        if stmt.kind == "show_tables":
            table = show_tables(self._stores())
        elif stmt.kind == "describe":
            table = describe(self.resolve_store(stmt.table or ""))
        else:
            table, position, stats = self._select(stmt, req, position, deadline, stats)
        stats["rows"] = table.num_rows
        stats["elapsed_ms"] = round((time.perf_counter() - started) * 1000, 3)
        if isinstance(table, PointAnswer):
            return SqlResult(table.schema, table.batches(), position.to_token(), stats, rows=table.rows)
        return SqlResult(table.schema, iter(table.to_batches()), position.to_token(), stats)

    def _point(self, stmt: Statement, req: SqlRequest, position: Position, deadline: float,
               stats: dict[str, Any]) -> tuple[pa.Table, Position, dict[str, Any]] | None:
        """The fast path for key lookups; None when the query is not one (or the key needs the general path)."""
        stores = self._stores()
        cached = self._points.get(req.sql, False)
        if cached is False or (cached is not None and stores.get(cached.store.name) is not cached.store):
            cached = point_plan(stmt.select, stores) if stmt.select is not None else None
            if len(self._points) > 4096:  # one entry per distinct SQL text; keep it bounded
                self._points.clear()
            self._points[req.sql] = cached
        if cached is None or len(req.parameters) != stmt.param_count:
            return None
        key = cached.key(list(req.parameters))
        if key is None:
            return None
        defn = cached.store
        kb = defn.key.serialize(key)
        partition = partition_for(kb, defn.partitions)
        bound = PositionBound.at(position) if not position.is_empty() else PositionBound.unbounded()
        stats["partitions_queried"] = 1
        local = self.node.read_local(defn.name, partition, kb, bound)
        if local is not None:  # the common case when clients send keys to their owners
            stats["nodes"] = 1
            return cached.answer(key, local[0]), position.merge(local[1]), stats  # type: ignore[return-value]
        gathered = self.dispatcher.gather(
            defn.name, defn.partitions, [SubQuery(KeyQuery(key), (partition,))], {"columns": list(cached.columns)},
            bound, req.allow_stale, req.max_lag, deadline,
        )
        batches = gathered.batches
        schema = defn.arrow_schema()
        table = pa.Table.from_batches(batches) if batches else schema.empty_table().select(list(cached.columns))
        stats["nodes"] = len(gathered.nodes)
        return table.select(list(cached.columns)).rename_columns(list(cached.names)), position.merge(gathered.position), stats

    def _select(self, stmt: Statement, req: SqlRequest, position: Position, deadline: float,
                stats: dict[str, Any]) -> tuple[pa.Table, Position, dict[str, Any]]:
        if not stmt.explain:
            fast = self._point(stmt, req, position, deadline, stats)
            if fast is not None:
                return fast
        plan_key = None if stmt.explain else _plan_key(req)
        kept = self._plans.get(plan_key) if plan_key is not None else None
        if kept is not None and self._stores().get(kept[0].store.name) is kept[0].store:  # type: ignore[union-attr]
            return self._gather(kept[0], kept[1], req, position, deadline, stats)
        select = bind_parameters(stmt.select, list(req.parameters), stmt.param_count)  # type: ignore[arg-type]
        source = select.args.get("from_") or select.args.get("from")
        if source is None:
            virtual = pa.table({"__one": pa.array([1], pa.int64())})  # SELECT 1: one row, no store
            plan = plan_select(select, virtual.schema, None, virtual, [])
        else:
            tbl = source.this
            if not hasattr(tbl, "db") or tbl.__class__.__name__ != "Table":
                raise SqlError("UNSUPPORTED", f"FROM {tbl.sql()[:60]} is not supported; name one store")
            if tbl.catalog and tbl.catalog.lower() != CATALOG:
                raise SqlError("UNKNOWN_STORE", f"unknown catalog {tbl.catalog!r}; the one catalog is {CATALOG!r}")
            if tbl.db and tbl.db.lower() == "information_schema":
                virtual = information_schema(tbl.name.lower(), self._stores())
                if virtual is None:
                    raise SqlError("UNKNOWN_STORE", f"information_schema has tables and columns, not {tbl.name!r}")
                plan = plan_select(select, virtual.schema, None, virtual, [])
            elif tbl.db and tbl.db.lower() != SCHEMA:
                raise SqlError("UNKNOWN_STORE", f"unknown schema {tbl.db!r}; stores live in the schema {SCHEMA!r}")
            else:
                defn = self.resolve_store(tbl.name)
                ruled = first_plan(sql_rules(), select, defn)
                if ruled is not None and ruled[1].combine is not None:
                    return self._combined(ruled[0], ruled[1], defn, stmt.explain, req, position, deadline, stats)
                plan = plan_select(select, defn.arrow_schema(), defn, None, [])
                if ruled is not None:  # the rule's queries replace the built-in key planning
                    plan.subqueries = ruled[1].subqueries
                    plan.notes.append(f"rule {ruled[0].name}: {ruled[1].note}")
        if stmt.explain:
            return self._explain(plan), position, stats
        if plan.store is None:
            assert plan.virtual is not None
            batches = run(plan.pipeline, plan.virtual).to_batches()
            return finish(plan, batches), position, stats
        pipeline = plan.pipeline.to_dict()
        if plan_key is not None:
            if len(self._plans) >= 1024:  # one entry per distinct SQL text and parameters; keep it bounded
                self._plans.clear()
            self._plans[plan_key] = (plan, pipeline)
        return self._gather(plan, pipeline, req, position, deadline, stats)

    def _gather(self, plan: SelectPlan, pipeline: dict[str, Any], req: SqlRequest, position: Position,
                deadline: float, stats: dict[str, Any]) -> tuple[pa.Table, Position, dict[str, Any]]:
        assert plan.store is not None
        gathered = self.dispatcher.gather(
            plan.store.name, plan.store.partitions, plan.subqueries, pipeline,
            PositionBound.at(position) if not position.is_empty() else PositionBound.unbounded(),
            req.allow_stale, req.max_lag, deadline,
        )
        stats["partitions_queried"] = len({p for _, p in gathered.partitions})
        stats["nodes"] = len(gathered.nodes)
        return finish(plan, gathered.batches), position.merge(gathered.position), stats

    def _combined(self, rule: SqlRule, rp: RulePlan, defn: StoreDefinition, explain: bool, req: SqlRequest,
                  position: Position, deadline: float, stats: dict[str, Any]) -> tuple[pa.Table, Position, dict[str, Any]]:
        """A rule that builds the rows itself from as many rounds of calls as it needs."""
        if explain:
            return self._explain_calls(defn, rp.subqueries, f"via rule {rule.name}", "nothing", rp.note), position, stats
        bound = PositionBound.at(position) if not position.is_empty() else PositionBound.unbounded()
        seen: dict[str, Any] = {"position": position, "partitions": set(), "nodes": set()}

        def fetch(subqueries: list[SubQuery]) -> list[pa.RecordBatch]:
            gathered = self.dispatcher.gather(defn.name, defn.partitions, subqueries, None, bound,
                                              req.allow_stale, req.max_lag, deadline)
            seen["position"] = seen["position"].merge(gathered.position)
            seen["partitions"] |= {p for _, p in gathered.partitions}
            seen["nodes"] |= set(gathered.nodes)
            return gathered.batches

        table = rp.combine(fetch)  # type: ignore[misc]
        stats["partitions_queried"] = len(seen["partitions"])
        stats["nodes"] = len(seen["nodes"])
        if rp.remaining is not None:
            plan = plan_select(rp.remaining, table.schema, None, table, [])
            table = finish(plan, run(plan.pipeline, table).to_batches())
        return table, seen["position"], stats

    def _explain(self, plan: SelectPlan) -> pa.Table:
        remaining = []
        if plan.aggregate:
            remaining.append("final aggregate")
        if plan.having is not None:
            remaining.append(f"having {plan.having.sql()}")
        if plan.order:
            remaining.append("merge sort " + ", ".join(f"{e.sql()} {'DESC' if d else 'ASC'}" for e, d, _ in plan.order))
        if plan.offset or plan.limit is not None:
            remaining.append(f"offset {plan.offset} limit {plan.limit}")
        remaining.append("select " + ", ".join(n for n, _ in plan.outputs))
        if plan.store is not None:
            via = "; ".join(f"via {n}" for n in plan.notes)
            return self._explain_calls(plan.store, plan.subqueries, via, plan.pipeline.describe(), "; ".join(remaining))
        row = ["(catalog)", "local table", "", self.node.node_id + " (local)", plan.pipeline.describe(),
               "; ".join(remaining)]
        return pa.table({k: pa.array([v], pa.string()) for k, v in zip(_EXPLAIN_COLUMNS, row)})

    def _explain_calls(self, store: StoreDefinition, subqueries: list[SubQuery], via: str, pushed_down: str,
                       at_receiver: str) -> pa.Table:
        """One row per node call: the store, query, partitions, target node, what runs where."""
        rows: dict[str, list] = {k: [] for k in _EXPLAIN_COLUMNS}
        view = self.node.view
        for sq in subqueries:
            parts = sq.partitions if sq.partitions is not None else range(store.partitions)
            by_node: dict[str, list[int]] = {}
            for p in parts:
                owner = view.active_owner(store.name, p)
                by_node.setdefault(owner.node_id if owner else "(no owner)", []).append(p)
            for node_id, ps in sorted(by_node.items()):
                rows["store"].append(store.name)
                rows["query"].append(repr(sq.query) + (f" {via}" if via else ""))
                rows["partitions"].append(",".join(map(str, ps)))
                rows["node"].append(node_id + (" (local)" if node_id == self.node.node_id else ""))
                rows["pushed_down"].append(pushed_down)
                rows["at_receiver"].append(at_receiver)
        return pa.table({k: pa.array(v, pa.string()) for k, v in rows.items()})


_EXPLAIN_COLUMNS = ("store", "query", "partitions", "node", "pushed_down", "at_receiver")
