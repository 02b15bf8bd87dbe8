"""The SQL front door of a node: parse → plan → route → dispatch → merge."""

from __future__ import annotations

import functools
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Awaitable, Callable, Iterator

import pyarrow as pa

from federator.catalog.definition import StoreDefinition
from federator.dispatch.dispatcher import Dispatcher, Gathered
from federator.dispatch.errors import DispatchError, NotColocated, NotNow
from federator.errors import SqlError
from federator.memo import by_identity
from federator.node.protocol import ServingNode
from federator.owner.duck import Duck
from federator.owner.duck_types import as_typed
from federator.partitioner import partition_for
from federator.plan.keys import SubQuery
from federator.plugin.registry import Registry
from federator.query.owner_work import OwnerWork
from federator.query.position import Position, PositionBound
from federator.query.queries import KeyQuery, UnknownQueryType
from federator.query.rows import Rows
from federator.route.read_options import ReadOptions
from federator.route.router import local_refusals
from federator.settings import PLAN_TEMPLATES, POINT_PLANS, STATEMENT_PLANS
from federator.sql import writeback
from federator.sql.answers import (AT_ONCE_ROWS, Answer, Relation, answer_of, answer_stats, as_arrow, check_deadline,
                                   counted_batches, finished, finished_without_duck, relation_of)
from federator.sql.catalog_tables import describe, information_schema, show_tables
from federator.sql.dispatch_errors import from_dispatch
from federator.sql.explain import explain
from federator.sql.finish import TopRows
from federator.sql.kept_answers import KeptAnswers, Known, Watch, reaches, stores_read
from federator.sql.parse import DIALECT, Statement, dialect_of, parse
from federator.sql.planner import QueryPlan, StoreRef, bind_parameters, literal, plan_query
from federator.sql.point import PointPlan, point_plan
from federator.sql.pushdown import is_volatile
from federator.sql.result import SqlRequest, SqlResult
from federator.store.layer import UNBOUNDED, StoredEntry



def _plan_key(req: SqlRequest) -> tuple | None:
    """What a store query's plan depends on besides the store: the SQL text and the parameters
    with their types (1 and True hash alike, and bind differently); None when some parameter
    cannot be a key."""
    key = (req.sql, req.dialect, tuple((type(p), p) for p in req.parameters))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def plan_kind(plan: QueryPlan) -> str:
    """What a planned statement reads, as the metrics count it: plugin (a plugin's SQL rule
    builds some store's rows), join (more than one store, or a join on the owners), aggregate
    (the owners aggregate their partitions' rows), scan (any other read of a store), other
    (no store: the catalog's tables, constants). The point lookup's fast path is "point"."""
    refs = plan.refs
    if not refs:
        return "other"
    if any(ref.combine is not None for ref in refs):
        return "plugin"
    if len(refs) > 1 or any(ref.joined is not None or ref.key_join is not None for ref in refs):
        return "join"
    if any(ref.work.kind == "partial aggregate" for ref in refs):
        return "aggregate"
    return "scan"


class SqlEngine:
    def __init__(self, node: ServingNode, registry: Registry, metrics: Any = None) -> None:
        """``registry``: the node's; its SQL rules plan, and it names the plugins behind queries.
        ``metrics``: the node's (``federator.metrics.Metrics``), told of every statement
        (its kind, outcome and time) and of the dispatcher's calls; None counts nothing."""
        self.node = node
        self.registry = registry
        self.metrics = metrics
        self.dispatcher = Dispatcher(node, metrics=metrics)
        self._points: dict[Any, PointPlan | None] = {}  # SQL text -> its point plan (None: not a point lookup)
        # (SQL text, parameters) -> a store query's plan and its pipeline as sent: planning costs
        # more than answering a repeated aggregate over kept scans
        self._plans: dict[tuple, QueryPlan] = {}
        self._templates: dict[tuple, _Template] = {}  # (text, dialect, parameter types) -> a plan to rebind
        self.duck: Duck = node.duck
        # store references of one statement are fetched side by side (the dispatcher's own pool
        # makes the node calls; a separate pool cannot wait on itself)
        self._refs_pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="sql-refs")
        # How long an answer is reused while positions stay the same. A position names a state
        # only while its changelog lives: a topic deleted and created again (a broker restarted
        # empty) starts its offsets over, and could come back to the same offsets with other
        # rows. Such a reset takes longer than this to be noticed and refilled, so within it a
        # position is a name.
        self._reuse_seconds: float = node.config.reuse_answers_seconds
        # Kept with the plan they answer: a store defined again over the same changelog (the
        # same positions) is planned again, and its kept answers are not that plan's.
        self._answers = KeptAnswers(self._reuse_seconds, node.config.statement_answers, node.unchanged_since)

    def _stores(self) -> dict[str, StoreDefinition]:
        return self.node.stores

    def resolve_store(self, name: str) -> StoreDefinition:
        """The store called ``name`` (case-insensitively), or UNKNOWN_STORE saying what there is."""
        stores = self._stores()
        defn = stores.get(name) or next((d for n, d in stores.items() if n.lower() == name.lower()), None)
        unusable = self.node.unusable_stores
        if defn is None and name in unusable:
            raise SqlError("UNKNOWN_STORE", f"this node cannot read store {name!r}: {unusable[name]}; "
                                            "install what it needs on every node, or send the query to a node that has it")
        if defn is None and not self.node.catalog_read():
            raise SqlError("UNAVAILABLE", f"this node has not read the catalog yet, so it cannot tell whether store "
                                          f"{name!r} exists: ask again in a moment, or ask another node")
        if defn is None:
            known = ", ".join(sorted(stores)) or "none yet"
            raise SqlError("UNKNOWN_STORE", f"unknown store {name!r}; stores are: {known} (SHOW TABLES lists them)")
        return defn

    def execute(self, req: SqlRequest, plan: QueryPlan | None = None, at_once: bool = False) -> SqlResult:
        """``req``'s answer; ``plan``: the statement's plan for these parameters when the caller
        holds it already (``local_global``), not looked up again. ``at_once``: from the copies
        as they are now, or NotNow (uncounted: the caller asks again where it may wait)."""
        return self._counted(lambda started, track: self._execute(req, started, track, plan, at_once))

    def _counted(self, answer: Callable[[float, list[Any]], SqlResult]) -> SqlResult:
        """``answer(started, track)``'s result, counted in the metrics by the statement's kind and
        outcome: ``track`` is [the kind once known, whether the answer streams out (then counted
        at its end)]."""
        started = time.perf_counter()
        track: list[Any] = ["unknown", False]
        try:
            result = answer(started, track)
        except NotNow:
            raise
        except SqlError as e:
            self._count(track[0], e.code, started)
            raise
        except (DispatchError, UnknownQueryType) as e:  # partitions could not be read: the dispatcher says why
            err = from_dispatch(e, self.registry.provider_of)
            self._count(track[0], err.code, started)
            raise err from None
        except Exception:
            self._count(track[0], "INTERNAL", started)
            raise
        if not track[1]:
            self._count(track[0], "ok", started)
        return result

    def _count(self, kind: str, outcome: str, started: float) -> None:
        if self.metrics is not None:
            self.metrics.query(kind, outcome, time.perf_counter() - started)

    def _execute(self, req: SqlRequest, started: float, track: list[Any], plan: QueryPlan | None,
                 at_once: bool) -> SqlResult:
        deadline = time.monotonic() + req.timeout_ms / 1000
        try:
            position = Position.from_token(req.consistency_token) if req.consistency_token else Position()
        except ValueError as e:
            raise SqlError("INVALID_PARAMETER", str(e)) from None
        stmt = parse(req.sql, dialect_of(req.dialect))
        stats = answer_stats()
        options = ReadOptions(PositionBound.at(position) if not position.is_empty() else PositionBound.unbounded(),
                              req.allow_stale, req.max_lag, deadline, at_once)
        if stmt.kind == "show_tables":
            track[0] = "other"
            table = show_tables(self._stores())
        elif stmt.kind == "describe":
            track[0] = "other"
            table = describe(self.resolve_store(stmt.table or ""))
        else:
            table, position, stats = self._select(stmt, req, position, options, stats, track, plan)
        if isinstance(table, tuple):  # DuckDB's answer, counted as it streams out
            track[1] = True
            return self._streamed(table, track[0], position, stats, started)
        return finished(table, position, stats, started)

    def _streamed(self, answer: tuple[pa.Schema, Iterator[pa.RecordBatch]], kind: str, position: Position,
                  stats: dict[str, Any], started: float) -> SqlResult:
        """A statement's streamed answer, counted (as ``kind``) when it ends."""
        schema, batches = answer
        counted = counted_batches(batches, stats, started, lambda outcome: self._count(kind, outcome, started))
        return SqlResult(schema, counted, position.to_token(), stats)

    def local_kept(self, req: SqlRequest, plan_key: tuple | None = None) -> SqlResult | None:
        """A repeated statement's small answer kept at this node, when every partition it reads
        is known to be where it was then: at once, without planning, reading or waiting; None
        otherwise, and then ``execute`` answers it, the same (see ``point_now``). ``plan_key``:
        ``_plan_key(req)``, when the caller has it."""
        if req.consistency_token or req.allow_stale or self._reuse_seconds <= 0:
            return None
        started = time.perf_counter()
        plan_key = plan_key or _plan_key(req)
        plan = self._exact_plan(plan_key) if plan_key is not None else None
        # execute takes the point path for a point text
        if plan is None or self._points.get(_point_text(req), False) is not None:
            return None
        stats = answer_stats()
        options = ReadOptions(PositionBound.unbounded(), False, req.max_lag, time.monotonic() + req.timeout_ms / 1000)
        watch = self._watched(plan, req, options)[1]
        reused = self._reused(plan, watch, Position(), stats, small=True) if watch is not None else None
        if reused is None:
            return None
        if isinstance(reused[0], Rows):
            result = finished(reused[0], reused[1], stats, started)
            self._count(plan_kind(plan), "ok", started)
            return result
        return self._streamed(reused[0], plan_kind(plan), reused[1], stats, started)

    def answer_now(self, req: SqlRequest) -> SqlResult | RoutedPoint | None:
        """``execute``'s answer, given when nothing in it can wait: a point query this node
        reads from its own copy, or what reads it from the key's owner elsewhere on the event
        loop (``point_now``), a statement's kept answer still current (``local_kept``), or a
        statement over this node's global stores that their store type answers in one read
        (``local_global``). None otherwise (planning a new text, a consistency token to wait
        for, a copy too far behind), and ``execute`` answers it. For the HTTP server's event loop."""
        found = self.point_now(req)
        if found is not None or req.consistency_token:
            return found
        # a rank of any player: its text's rule read straight from the copies, with no plan to look up
        template = self._template(req)
        if template is not None and template.together:
            return self._together_or_none(req, template.plan)
        plan_key = _plan_key(req)
        if plan_key is None:
            return None
        kept = self.local_kept(req, plan_key)
        if kept is not None:
            return kept
        plan = self._exact_plan(plan_key)
        return None if plan is None else self._kept_global_now(req, plan)

    def local_global(self, req: SqlRequest, plan_key: tuple | None = None) -> SqlResult | None:
        """A statement over this node's global stores whose small answer their store type
        builds from every partition in one read (a leaderboard's ranks and top-k), with nothing
        for DuckDB to do, when every copy answers now; None otherwise (see ``point_now``).
        ``plan_key``: ``_plan_key(req)``, when the caller has it."""
        plan_key = plan_key or _plan_key(req)
        if req.consistency_token or plan_key is None:
            return None
        # kept only for a SELECT that planned (not for EXPLAIN): no parse, so no error, here
        plan = self._exact_plan(plan_key)
        if plan is not None:
            return self._kept_global_now(req, plan)
        # the text asked with other values (a rank of any player): its rule read with these
        template = self._template(req)
        return self._together_or_none(req, template.plan) if template is not None and template.together else None

    def _kept_global_now(self, req: SqlRequest, plan: QueryPlan) -> SqlResult | None:
        """``local_global``'s answer for the plan kept for the statement and its very values."""
        if not _small_and_together(plan):
            return None
        try:
            return self.execute(req, plan, at_once=True)
        except NotNow:  # a copy must catch up first: asked again where that may be waited for
            return None

    def _together_or_none(self, req: SqlRequest, template: QueryPlan) -> SqlResult | None:
        """``_together_now``'s answer, counted; None when it is not to be given now (NotNow)."""
        try:
            return self._counted(functools.partial(self._together_now, req, template))
        except NotNow:  # a copy must catch up first: asked again where that may be waited for
            return None

    def _together_now(self, req: SqlRequest, template: QueryPlan, started: float, track: list[Any]) -> SqlResult:
        """``execute``'s answer to ``template`` (its text's plan) with the statement's values,
        over one global store (``_small_and_together``): its rule's plan for the values, read
        straight from this node's copies. None of the general path's planning, routing,
        watching and keeping, which such a read has no use for (a rank of one of many players
        is not kept: ``_watched``), and which cost more than the read. NotNow when the rule
        plans these values otherwise, a copy may not answer now, or the answer needs more
        (DuckDB, a rule's later round)."""
        track[0] = plan_kind(template)
        (ref,) = template.refs
        assert ref.rebind is not None, "a template's rule rebinds (_template)"
        ruled = ref.rebind([literal(p, i) for i, p in enumerate(req.parameters)])
        if ruled is None or ruled.combine is None:
            raise NotNow("the rule plans these values otherwise", [])
        defn = ref.store
        deadline = time.monotonic() + req.timeout_ms / 1000
        if req.allow_stale and local_refusals(ReadOptions(UNBOUNDED, True, req.max_lag, deadline), range(defn.partitions),
                                              functools.partial(self.node.local_lag, defn.name)):
            raise NotNow("a copy is further behind than max_lag", [])
        fetch = _TogetherFetch(self.node, defn.name, require_active=not req.allow_stale)
        rows = ruled.combine(fetch)
        check_deadline(deadline, "reading the partitions")
        if req.cancel is not None and req.cancel.cancelled:
            raise SqlError("TIMEOUT", "canceling statement due to user request")
        stats = answer_stats(partitions=defn.partitions, nodes=1)
        table = finished_without_duck(template, rows, stats)
        if table is None:
            raise NotNow("DuckDB finishes the answer", [])
        return finished(table, fetch.position or Position(), stats, started)

    def point_now(self, req: SqlRequest) -> SqlResult | RoutedPoint | None:
        """A point query's answer read from this node's own current copy, at once; or, when
        another node owns the key's partition, what reads the key's entry from that node on
        the event loop (``RoutedPoint.answer``, as the dispatcher's ``key_call`` makes it).
        None when it needs anything that could wait (planning a new text, a consistency token,
        the general path), and then ``execute`` answers it, the same. For the HTTP server's
        event loop, which answers what it can without handing the request to a thread."""
        started = time.perf_counter()
        found = self._planned_point(req)
        if found is None:
            return None
        plan, kb, partition = found
        entry = self.node.read_local(plan.store.name, partition, kb, UNBOUNDED)
        if entry is not None:
            return self._point_result(plan, kb, entry, started)
        options = ReadOptions(UNBOUNDED, req.allow_stale, req.max_lag, time.monotonic() + req.timeout_ms / 1000)
        call = self.dispatcher.key_call(plan.store.name, partition, options)
        if call is None:
            return None
        return RoutedPoint(functools.partial(self.dispatcher.read_key_soon, call, kb),
                           functools.partial(self._point_result, plan, kb, started=started))

    def _planned_point(self, req: SqlRequest) -> tuple[PointPlan, bytes, int] | None:
        """A point query's plan, key bytes and partition, when ``execute`` has planned its text
        and it asks for no consistency token (that may wait); None otherwise."""
        if req.consistency_token:
            return None
        plan = self._points.get(_point_text(req))
        if plan is None or self._stores().get(plan.store.name) is not plan.store:
            return None
        found = _point_key(plan, parse(req.sql, dialect_of(req.dialect)), req)  # parsed before: cached
        return None if found is None else (plan, found[1], found[2])

    def _point_result(self, plan: PointPlan, kb: bytes, entry: StoredEntry, started: float) -> SqlResult | None:
        """A point query's answer from its key's stored entry, counted as ``execute`` counts it;
        None when the plan cannot answer from the entry (the general path does)."""
        answer = plan.answer(kb, entry.stored)
        if answer is None:
            return None
        stats = answer_stats(partitions=1, nodes=1)
        result = finished(answer, entry.position, stats, started)
        self._count("point", "ok", started)
        return result

    def _point_plan(self, stmt: Statement, req: SqlRequest, deadline: float) -> PointPlan | None:
        """The point plan of the statement's text, planned once per text (None: not a point lookup)."""
        stores = self._stores()
        text = _point_text(req)
        cached = self._points.get(text, False)
        if cached is False or (cached is not None and stores.get(cached.store.name) is not cached.store):
            cached = point_plan(stmt.select, stores) if stmt.select is not None else None
            if cached is not None:  # DuckDB's names and types (and its errors), planned once per text
                cached = cached.typed(self._plan(stmt, req, deadline).schema)
            if len(self._points) > POINT_PLANS:  # one entry per distinct SQL text; keep it bounded
                self._points.clear()
            self._points[text] = cached
        return cached

    def _point(self, stmt: Statement, req: SqlRequest, position: Position, options: ReadOptions,
               stats: dict[str, Any]) -> tuple[pa.Table, Position, dict[str, Any]] | None:
        """The fast path for key lookups; None when the query is not one (or the key needs the general path)."""
        cached = self._point_plan(stmt, req, options.deadline)
        found = None if cached is None else _point_key(cached, stmt, req)
        if cached is None or found is None:
            return None
        defn = cached.store
        key, kb, partition = found
        stats["partitions_queried"] = 1
        # the common case when clients send keys to their owners; then the owner's stored bytes
        # in one lean call; else the general path, which retries and says why it cannot
        entry = (self.node.read_local(defn.name, partition, kb, options.bound)
                 or self.dispatcher.read_key(defn.name, partition, kb, options))
        if entry is not None:
            answer = cached.answer(kb, entry.stored)
            if answer is not None:
                stats["nodes"] = 1
                return answer, position.merge(entry.position), stats
        gathered = self.dispatcher.gather(
            defn.name, defn.partitions, [SubQuery(KeyQuery(key), (partition,))], OwnerWork(tuple(cached.columns)),
            options)
        batches = gathered.batches
        schema = defn.arrow_schema()
        table = pa.Table.from_batches(batches) if batches else schema.empty_table().select(list(cached.columns))
        stats["nodes"] = len(gathered.nodes)
        return table.select(list(cached.columns)).rename_columns(list(cached.names)), position.merge(gathered.position), stats

    def _select(self, stmt: Statement, req: SqlRequest, position: Position, options: ReadOptions,
                stats: dict[str, Any], track: list[Any],
                plan: QueryPlan | None) -> tuple[pa.Schema, Iterator[pa.RecordBatch], Position, dict[str, Any]] | tuple:
        if not stmt.explain and plan is None:
            track[0] = "point"
            fast = self._point(stmt, req, position, options, stats)
            if fast is not None:
                return fast
            track[0] = "unknown"
        plan = plan or self._plan(stmt, req, options.deadline)
        if stmt.explain:
            track[0] = "other"
            return explain(plan, self.node), position, stats
        track[0] = plan_kind(plan)
        try:
            return self._run(plan, req, position, options, stats)
        except NotColocated:  # a rebalance parted a join's shards: join at the receiver this time
            return self._run(self._plan(stmt, req, options.deadline, copartitioned=False), req, position, options,
                             stats, reuse=False)

    def _run(self, plan: QueryPlan, req: SqlRequest, position: Position, options: ReadOptions,
             stats: dict[str, Any], reuse: bool = True) -> tuple:
        check_deadline(options.deadline, "planning")
        plan_key, watch = self._watched(plan, req, options) if reuse else (None, None)
        reused = self._reused(plan, watch, position, stats) if watch is not None else None
        if reused is not None:
            return (*reused, stats)
        seen = _Seen(known=watch.known.key if watch is not None else None)
        relations = self._read(plan, options, seen)
        seen.count_into(stats, plan)
        check_deadline(options.deadline, "reading the partitions")
        if req.cancel is not None and req.cancel.cancelled:
            raise SqlError("TIMEOUT", "canceling statement due to user request")
        if watch is not None and not _read_at_known(seen, watch.known.at, plan, watch.stores):
            watch = None  # an owner moved on meanwhile: this answer is not the one at ``known``
        answer = self._answer(plan, req, options, relations, seen, plan_key, watch, stats)
        return answer, position.merge(seen.position), stats

    def _watched(self, plan: QueryPlan, req: SqlRequest, options: ReadOptions) -> tuple[tuple | None, Watch | None]:
        """The key ``plan``'s answer is kept under (None: it is neither taken from nor kept for
        another), and the watch that names the positions it would be at (see ``_watch``). Not
        for a plan rebound to the statement's values (``_kept_plan``): a text asked with ever
        other values (a rank of any one of many players) would keep answers that are seldom
        asked again, and watching costs a quarter of such an answer."""
        plan_key = _plan_key(req) if self._reuse_seconds > 0 and plan.deterministic and not plan.local \
            and plan.origin is None else None
        if plan_key is not None and self._plans.get(plan_key) is not plan:
            plan_key = None
        watch = self._watch(plan, plan_key, options) if plan_key is not None and not options.allow_stale else None
        return plan_key, watch

    def _reused(self, plan: QueryPlan, watch: Watch, position: Position, stats: dict[str, Any],
                small: bool = False) -> tuple[Answer, Position] | None:
        """The answer kept for ``plan`` at the watched positions (no owner asked), and its
        position; None when there is none (``small``: none small enough for the event loop)."""
        kept = self._answers.get(watch.key, plan)
        if kept is None:
            kept = self._answers.followed(plan, watch)
            if kept is None:
                return None
            stats["answer_followed_writes"] = True
        if small and not kept.small():
            return None
        stats.update(answer_reused=True, partitions_queried=0, nodes=0)
        if any(ref.joined is not None for ref in plan.refs):
            stats["joined_on_owners"] = True  # as the kept answer was
        # the Position kept with it: equal to ``known``, and its token made once
        return kept.answer(), position.merge(kept.at or watch.known.at)

    def _watch(self, plan: QueryPlan, plan_key: tuple, options: ReadOptions) -> Watch | None:
        """When every partition of ``plan``'s stores is known to be where it is now (its owners'
        watches say so) and reaches the request's bound: what names the answer at those
        positions. Still where this node last computed the statement, that answer is this one,
        and no owner is asked."""
        stores = stores_read(plan, self._stores())
        found = self.dispatcher.known_positions(stores) if stores is not None else None
        if stores is None or found is None or not reaches(found[1], options.bound):
            return None
        known = Known(*found)
        return Watch((plan_key, "watched", known.key), known, stores)

    def _read(self, plan: QueryPlan, options: ReadOptions, seen: _Seen) -> dict[str, pa.Table]:
        """Every relation the statement reads: the catalog's tables and each store reference's
        rows, as the owners return them."""
        relations: dict[str, pa.Table] = {r.relation: r.table for r in plan.local}
        if len(plan.refs) == 1:
            relations[plan.refs[0].relation] = self._rows(plan.refs[0], options, seen)
        else:  # each store's calls at once: a statement waits for its slowest store, not their sum
            futures = [(ref, self._refs_pool.submit(self._rows, ref, options, seen)) for ref in plan.refs]
            for ref, future in futures:
                relations[ref.relation] = future.result()
        return relations

    def _answer(self, plan: QueryPlan, req: SqlRequest, options: ReadOptions, relations: dict[str, Relation],
                seen: _Seen, plan_key: tuple | None, watch: Watch | None, stats: dict[str, Any]) -> Answer:
        """The statement's answer over the rows read: as the owners sent them, finished in
        Arrow (or in Python, for rows that came as Python values), kept from an earlier
        statement over the same rows, or DuckDB's; kept as the answer at the watched positions
        (``watch``) as it streams out."""
        watched, at = (watch.key, watch.known.at) if watch is not None else (None, None)
        if plan.columns_only is not None or plan.finish is not None:
            (rows,) = (relations[r.relation] for r in plan.refs)
            table = finished_without_duck(plan, rows, stats)
            if table is not None:
                return self._answers.keeping(watched, plan, answer_of(table), at)
        key = None
        if plan_key is not None:
            key = (plan_key, seen.position.to_token(), frozenset(seen.partitions))
            kept = self._answers.get(key, plan)
            if kept is not None:
                stats["answer_reused"] = True
                return self._answers.keeping(watched, plan, kept.answer(), at)
        relations = {name: as_arrow(r) for name, r in relations.items()}
        for ref in plan.refs:  # HUGEINT states as DuckDB's HUGEINT, not as the DECIMAL(38,0) they travel as
            if ref.rows_schema is not None:
                relations[ref.relation] = as_typed(relations[ref.relation], ref.rows_schema)
        schema, batches = self.duck.stream(plan.sql, relations, options.deadline, cancel=req.cancel)
        if key is not None:
            batches = self._answers.kept(key, plan, schema, batches)
        return self._answers.keeping(watched, plan, (schema, batches), at)


    def _plan(self, stmt: Statement, req: SqlRequest, deadline: float, copartitioned: bool = True) -> QueryPlan:
        plan_key = None if stmt.explain or not copartitioned else _plan_key(req)
        kept = self._kept_plan(req, plan_key) if plan_key is not None else None
        if kept is not None:
            return kept
        text_key = (req.sql, req.dialect, tuple(map(type, req.parameters))) if plan_key is not None \
            and req.parameters else None
        select = stmt.select
        assert select is not None, "only a statement that reads is planned (SHOW and DESCRIBE are not)"
        tree = bind_parameters(select, list(req.parameters), stmt.param_count)
        deterministic = not is_volatile(tree)
        source = None if dialect_of(req.dialect) != DIALECT else writeback.source(
            stmt.text, select, [literal(p, i).sql(dialect=DIALECT) for i, p in enumerate(req.parameters)])
        plan = plan_query(tree, self.resolve_store, lambda name: information_schema(name, self._stores()),
                          list(self.registry.sql_rules), lambda sql, rels: self._schema_of(sql, rels, deadline),
                          copartitioned, source)
        plan.deterministic = deterministic
        if plan_key is not None:
            self._keep_plan(plan_key, plan)
            if text_key is not None and plan.rebind is not None:
                _put_bounded(self._templates, text_key, _Template(plan, _small_and_together(plan)), PLAN_TEMPLATES)
        return plan

    def _kept_plan(self, req: SqlRequest, plan_key: tuple) -> QueryPlan | None:
        """The plan kept for the statement and its parameters, or its text's plan rebound to
        them; None when it must be planned."""
        kept = self._exact_plan(plan_key)
        if kept is not None:
            return kept
        template = self._template(req)
        if template is None:
            return None
        assert template.plan.rebind is not None
        # not kept per value: a rank of random players kept ~500 plans alive, each garbage
        # collection of the young objects walked them (holding the GIL each time), and an older
        # generation's took longer; rebinding costs tens of µs
        return template.plan.rebind(list(req.parameters))

    def _exact_plan(self, plan_key: tuple) -> QueryPlan | None:
        """The plan kept for a statement and its very parameters, while the stores it reads
        are the ones it was planned over."""
        kept = self._plans.get(plan_key)
        return kept if kept is not None and _same_stores(kept, self._stores()) else None

    def _template(self, req: SqlRequest) -> _Template | None:
        """The plan of the statement's text that other values of its parameters rebind
        (``QueryPlan.rebind``: where only a rule's calls read them), while the stores it reads
        are the ones it was planned over; None otherwise."""
        if not req.parameters:
            return None
        template = self._templates.get((req.sql, req.dialect, tuple(map(type, req.parameters))))
        return template if template is not None and _same_stores(template.plan, self._stores()) else None

    def _keep_plan(self, plan_key: tuple, plan: QueryPlan) -> None:
        _put_bounded(self._plans, plan_key, plan, STATEMENT_PLANS)  # one entry per distinct SQL text and parameters

    def _schema_of(self, sql: str, relations: dict[str, pa.Table], deadline: float) -> pa.Schema:
        """The schema of ``sql``'s answer over ``relations`` (DuckDB binds it: its errors are the
        user's), typed (federator.owner.duck_types). It runs the statement, over empty stores
        but whole where it reads none (a range(), a recursive CTE): within the request's
        timeout_ms."""
        schema, batches = self.duck.stream(sql, relations, deadline, typed=True)
        for _ in batches:
            pass
        return schema

    def _rows(self, ref: StoreRef, options: ReadOptions, seen: _Seen) -> Relation:
        """What the owners return for one store reference, as one table (or the Python values a
        global store's type gave on this node, ``Rows``)."""
        defn = ref.store

        def gather(subqueries: list[SubQuery], work: OwnerWork | None = None, keep: bool = False,
                   after: Position | None = None) -> Gathered:
            asked = options if after is None or after.is_empty() else replace(options, bound=_at_least(options.bound, after))
            gathered = self.dispatcher.gather(defn.name, defn.partitions, subqueries, work, asked,
                                              keep_for=self._reuse_seconds if keep else 0.0, known=seen.known)
            seen.add(defn.name, gathered)
            return gathered

        keeps = self.dispatcher.keeps(defn, options, self._reuse_seconds)
        if ref.combine is not None:
            return ref.combine(_RuleFetch(gather, keeps=keeps))
        # with a key join, a node that does not know it runs work's join in DuckDB
        batches = gather(ref.subqueries, replace(ref.work, join=ref.joined, key_join=ref.key_join),
                         keep=keeps and ref.keep_answers).batches
        return relation_of(ref, batches)


@dataclass(frozen=True)
class _Template:
    """A text's plan that other values of its parameters rebind (a plan with ``rebind``), and
    whether each of its statements is answered at once from this node's copies
    (``_small_and_together``), judged once as it is kept."""

    plan: QueryPlan
    together: bool


@dataclass(frozen=True)
class RoutedPoint:
    """A point query answered from the entry its key's owner elsewhere gives
    (``SqlEngine.point_now``)."""

    read: Callable[[], Awaitable[StoredEntry | None]]  # the owner's entry, on the running event loop
    finish: Callable[[StoredEntry], SqlResult | None]  # the answer from it, as ``execute`` gives it

    async def answer(self) -> SqlResult | None:
        """The statement's answer; None when the owner could not give the entry so, or the
        answer needs more than it (then ``execute`` answers, by its general path)."""
        entry = await self.read()
        return None if entry is None else self.finish(entry)


def _point_text(req: SqlRequest) -> Any:
    """What a point plan is kept under: the SQL text, and its dialect (the same text may parse otherwise)."""
    return req.sql if req.dialect is None else (req.sql, req.dialect)


def _point_key(plan: PointPlan, stmt: Statement, req: SqlRequest) -> tuple[Any, bytes, int] | None:
    """The key a point query looks up (as a value, its bytes, its partition); None when the
    parameters do not make one (the general path decides)."""
    if len(req.parameters) != stmt.param_count:
        return None
    key = plan.key(list(req.parameters))
    if key is None:
        return None
    kb = plan.store.key.serialize(key)
    return key, kb, partition_for(kb, plan.store.partitions)


def _same_stores(plan: QueryPlan, stores: dict[str, StoreDefinition]) -> bool:
    """Whether the stores ``plan`` reads are still the definitions it was planned over (a store
    defined again is planned again)."""
    return all(stores.get(r.store.name) is r.store for r in plan.refs)


# judged once a plan (a plan is replaced, not changed): every top-10 asked again asks it of the same kept plan
@functools.partial(by_identity, by_value=False)
def _small_and_together(plan: QueryPlan) -> bool:
    """Whether ``plan`` reads only global stores, each with queries its store type answers from
    every partition at once and no SQL for the owners, and its answer is small (a rule builds
    it, or the statement keeps at most AT_ONCE_ROWS rows) and needs no DuckDB."""
    if not plan.refs or plan.local or (plan.finish is None and plan.columns_only is None):
        return False
    finish = plan.finish
    few = isinstance(finish, TopRows) and finish.limit is not None and finish.limit + finish.offset <= AT_ONCE_ROWS
    for ref in plan.refs:
        together = ref.store.store_type.together_handlers
        if not ref.store.is_global or ref.work.sql is not None or ref.joined is not None \
                or not all(type(sq.query) in together for sq in ref.subqueries):
            return False
        if ref.combine is None and not few:
            return False
    return True


def _put_bounded(kept: dict, key: tuple, value: Any, most: int) -> None:
    if len(kept) >= most:  # planning again is cheaper than tracking which plans are still asked for
        kept.clear()
    kept[key] = value


@dataclass
class _Seen:
    """What one statement's reads saw, added to by its store references side by side."""

    known: tuple | None = None  # the partitions' states just read: kept partition answers are given by them
    position: Position = field(default_factory=Position)
    partitions: set[tuple[str, int]] = field(default_factory=set)  # (store, partition)
    nodes: set[str] = field(default_factory=set)
    reused: int = 0  # partitions answered from kept partition answers, without a call
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, store: str, gathered: Gathered) -> None:
        with self.lock:
            self.position = self.position.merge(gathered.position)
            self.partitions |= {(store, p) for _, p in gathered.partitions}
            self.nodes |= set(gathered.nodes)
            self.reused += gathered.reused

    def count_into(self, stats: dict[str, Any], plan: QueryPlan) -> None:
        stats["partitions_queried"] = len(self.partitions)
        stats["nodes"] = len(self.nodes)
        if self.reused:
            stats["partition_answers_reused"] = self.reused  # given again without a call
        if any(ref.joined is not None for ref in plan.refs):
            stats["joined_on_owners"] = True  # no rows of either store crossed the network before the join


class _RuleFetch:
    """A rule's ``fetch`` (federator.plugin.rules.Fetch). Each round reads no partition at a
    state older than an earlier round read it at: the answer's position is the newest each
    partition was read at, so a later round answered by a copy behind (another owner after a
    rebalance) would give counts older than that position says."""

    def __init__(self, gather: Callable[..., Gathered], keeps: bool) -> None:
        self._gather, self.keeps = gather, keeps
        self.refreshed_rows = 0
        self._read = Position()  # where the earlier rounds read

    def __call__(self, subqueries: list[SubQuery], keep: bool = False) -> list[pa.RecordBatch]:
        gathered = self._gather(subqueries, keep=keep and self.keeps, after=self._read)
        self._read = self._read.merge(gathered.position)
        self.refreshed_rows = gathered.refreshed_rows
        return gathered.batches


class _TogetherFetch:
    """A rule's ``fetch`` over one global store on this node (``SqlEngine._together_now``):
    each subquery answered by the store type from every partition's copy at once, in one
    round (a later round could read some partition at an older state than the first did;
    NotNow sends the statement where that is checked)."""

    keeps = False  # nothing is kept for a global store: its read is the whole answer
    refreshed_rows = 0

    def __init__(self, node: ServingNode, store: str, require_active: bool) -> None:
        self._node, self._store, self._require_active = node, store, require_active
        self.position: Position | None = None  # where the round read every partition

    def __call__(self, subqueries: list[SubQuery], keep: bool = False) -> list[pa.RecordBatch]:
        if self.position is not None:
            raise NotNow("a rule's later round over a global store", [])
        batches, read = [], []
        for sq in subqueries:
            # a together read is of every partition: a subquery naming some goes the general way
            result = self._node.read_together(self._store, sq.query, self._require_active) \
                if sq.partitions is None else None
            if result is None:
                raise NotNow("a copy cannot answer now", [])
            read.append(result.position)
            if result.batch is not None:
                batches.append(result.batch)
        self.position = read[0] if len(read) == 1 else Position().merge_all(read)
        return batches


def _at_least(bound: PositionBound, position: Position) -> PositionBound:
    """``bound`` raised to ``position`` wherever that is further on."""
    return PositionBound.at(position if bound.position is None else bound.position.merge(position))


def _read_at_known(seen: _Seen, known: Position, plan: QueryPlan, stores: list[StoreDefinition]) -> bool:
    """Whether every partition the owners answered was at its offset in ``known``, with the
    same partition of the store joined beside it (an empty shard has none in either)."""
    topic_of = {d.name: d.topic for d in stores}
    topics: dict[str, set[str]] = {}
    for ref in plan.refs:
        topics.setdefault(ref.store.name, set()).add(ref.store.topic)
        if ref.joined is not None:
            topics[ref.store.name].add(topic_of[ref.joined])
    read = seen.position
    # a global store joined on the owners: every partition of it beside each partition read
    broadcast = [d for d in stores if d.is_global and any(ref.joined == d.name for ref in plan.refs)]
    return all(read.get(t, p) == known.get(t, p) for store, p in seen.partitions for t in topics[store]) and \
        all(read.get(d.topic, p) == known.get(d.topic, p) for d in broadcast for p in range(d.partitions))

