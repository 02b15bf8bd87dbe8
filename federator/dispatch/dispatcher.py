"""Dispatch: one call per owning node carrying all its partitions, in parallel, with retries.

Partitions this node hosts run in-process. On NOT_PRESENT, NOT_ACTIVE, NOT_UP_TO_BOUND or a
node that does not answer, the routing view (kept current by heartbeats) is read again and
the partition retried with backoff until the deadline. Reads go to active owners, unless
stale reads are allowed, or a consistency token names the partition and a standby has reached
it while the owner cannot answer (see ``targets_for``). The internal endpoint never forwards,
so calls cannot loop between nodes that disagree during a rebalance. No silent partial
answers: every partition answers, or the query fails naming the ones that did not.
"""

from __future__ import annotations

import asyncio
import functools
import math
import threading
import time
from time import perf_counter  # the metrics' clock (tests replace ``time``)
from collections import defaultdict
from concurrent.futures import Future, ThreadPoolExecutor, wait
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, NamedTuple

import pyarrow as pa

from federator.dispatch.client import NodeCallError, NodeClient
from federator.dispatch.key_client import CallClient, CallUnavailable, KeyClient
from federator.dispatch.key_client_async import AsyncKeyClient
from federator.dispatch.partition_answers import PartitionAnswers
from federator.dispatch.position_watch import PositionWatch
from federator.node.protocol import ServingNode
from federator.dispatch.errors import NotColocated, NotNow, NotUpToBound, OwnerFailed, Timeout, Unavailable
from federator.plan.keys import SubQuery
from federator.query.owner_work import OwnerWork
from federator.query.queries import UnknownQueryType
from federator.query.position import Position, PositionBound
from federator.query.request import StateQueryRequest
from federator.query.result import FailureReason, QueryResult, all_ok
from federator.query.wire import NOT_COLOCATED
from federator.route.read_options import ReadOptions
from federator.store.layer import StoredEntry
from federator.route.router import local_refusals, targets_for


RETRYABLE = {FailureReason.NOT_PRESENT, FailureReason.NOT_ACTIVE, FailureReason.NOT_UP_TO_BOUND, FailureReason.DOES_NOT_EXIST}


@dataclass
class Gathered:
    batches: list[pa.RecordBatch] = field(default_factory=list)
    # each partition's answer's position, merged once when read (a merge per partition copied
    # the growing whole each time)
    positions: list[Position] = field(default_factory=list)
    partitions: set[tuple[int, int]] = field(default_factory=set)  # (subquery, partition)
    nodes: set[str] = field(default_factory=set)
    calls: list[dict[str, Any]] = field(default_factory=list)
    reused: int = 0  # partitions answered from kept answers, without a call
    refreshed_rows: int = 0  # rows of answers asked again because their partition moved since kept
    # what the answers read: per partition, the largest offset any of them names (set once
    # every answer is in, and read by each who takes the answers)
    position: Position = field(default_factory=Position)


class _Asked(NamedTuple):
    """A partition this gather asks for, whose answer may be kept."""

    state: tuple  # its state before the call
    moved: bool  # it moved since an answer was kept
    asking: Future | None  # through which this gather hands its answer to others


class _Waiting(NamedTuple):
    """A partition whose answer another gather is asking for at the same state."""

    item: tuple[int, int]  # (subquery, partition)
    state: tuple
    moved: bool
    other: Future  # the other gather's answer (None: it has none for us)


class _Group(NamedTuple):
    """What one request goes to: a node, a subquery, whether it must be the active copy."""

    node_id: str
    endpoints: tuple[str, str | None]  # its HTTP address and its key port's (None: it has none)
    subquery: int
    require_active: bool


class _Call(NamedTuple):
    node_id: str
    endpoints: tuple[str, str | None]
    subquery: int
    request: StateQueryRequest


class _Sent(NamedTuple):
    """A call sent over a key port whose answer is still to be read."""

    read: Callable[[], list[QueryResult]]
    abandon: Callable[[], None]
    call: _Call


class _Answer(NamedTuple):
    node_id: str
    subquery: int
    results: list[QueryResult]


@dataclass
class _Tries:
    """What one gather's rounds learned: why each partition is not answered yet, the nodes it
    should not ask next, the wait before the next round."""

    reasons: dict[tuple[int, int], str] = field(default_factory=dict)
    avoid: defaultdict[tuple[int, int], set[str]] = field(default_factory=lambda: defaultdict(set))
    behind: dict[tuple[int, int], str] = field(default_factory=dict)  # -> the node whose copy was behind the token
    delay: float = 0.02


class Dispatcher:
    def __init__(self, node: ServingNode, max_workers: int = 16, metrics: Any = None) -> None:
        """``metrics``: told of each call to another node (``internal_call``); None counts nothing."""
        self.node = node
        self.metrics = metrics
        self.pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="dispatch")
        self._clients: dict[str, NodeClient] = {}
        self._key_clients: dict[str, KeyClient] = {}
        self._async_key_clients: dict[str, AsyncKeyClient] = {}  # the event loop's (one loop uses them)
        self._call_clients: dict[str, CallClient] = {}
        self._watches: dict[str, PositionWatch] = {}  # key port -> its node's positions, as it says them
        self._watches_lock = threading.Lock()
        self.partition_answers = PartitionAnswers(node.config.partition_answers_mb << 20)
        # kept-answer key -> (the partition's state, the answer one gather is asking for): the
        # others that want it at the same state wait for that call rather than make their own
        self._asking: dict[tuple, tuple[tuple, Future]] = {}
        self._asking_lock = threading.Lock()

    def _query(self, node_id: str, endpoints: tuple[str, str | None], req: StateQueryRequest,
               timeout: float) -> list[QueryResult]:
        """One call to node ``node_id`` carrying all its partitions of ``req``, counted.
        ``endpoints``: its HTTP address and its key port's (None: it has none)."""
        if self.metrics is None:
            return self._call(endpoints, req, timeout)
        return self._counted(node_id, perf_counter(), lambda: self._call(endpoints, req, timeout))

    def _counted(self, node_id: str, started: float, call: Callable[[], list[QueryResult]]) -> list[QueryResult]:
        """``call()``, told to the metrics as a call to ``node_id`` begun at ``started``."""
        outcome = "ok"
        try:
            return call()
        except NodeCallError as e:
            outcome = _outcome(e)
            raise
        except Exception:
            outcome = "INTERNAL"
            raise
        finally:
            if self.metrics is not None:
                self.metrics.internal_call(node_id, "query", outcome, perf_counter() - started)

    def _send(self, node_id: str, endpoints: tuple[str, str | None], req: StateQueryRequest,
              timeout: float) -> tuple[Callable[[], list[QueryResult]], Callable[[], None]] | None:
        """``req`` sent over the node's key port now: what reads its answer (counted as
        ``_query`` counts a call) and what abandons it unread, or None when the node has no
        port or it cannot take the call (the caller makes the call through the pool)."""
        if endpoints[1] is None:
            return None
        started = perf_counter()
        try:
            pending = self._call_client(endpoints[1]).send(req, timeout)
        except CallUnavailable:
            return None
        except NodeCallError as e:
            if self.metrics is not None:
                self.metrics.internal_call(node_id, "query", _outcome(e), perf_counter() - started)
            raise

        def read() -> list[QueryResult]:
            try:
                return pending()
            except CallUnavailable:  # the port went away under the call: over HTTP, as _call does
                return self._client(endpoints[0]).query(req, max(0.05, timeout - (perf_counter() - started)))
        return (lambda: self._counted(node_id, started, read)), pending.abandon

    def _call(self, endpoints: tuple[str, str | None], req: StateQueryRequest, timeout: float) -> list[QueryResult]:
        """Over the node's key port, a connection this thread keeps (no HTTP server or client on
        either side); over HTTP when the node has no such port or it cannot take the call."""
        endpoint, key_endpoint = endpoints
        if key_endpoint is not None:
            try:
                return self._call_client(key_endpoint).query(req, timeout)
            except CallUnavailable:
                pass
        return self._client(endpoint).query(req, timeout)

    def _call_client(self, key_endpoint: str) -> CallClient:
        c = self._call_clients.get(key_endpoint)
        if c is None:
            c = self._call_clients[key_endpoint] = CallClient(key_endpoint, self.node.cluster_secret,
                                                              self.node.tls)
        return c

    def _client(self, endpoint: str) -> NodeClient:
        c = self._clients.get(endpoint)
        if c is None:
            c = self._clients[endpoint] = NodeClient(endpoint, self.node.cluster_secret, tls=self.node.tls)
        return c

    def _key_client(self, endpoint: str) -> KeyClient:
        c = self._key_clients.get(endpoint)
        if c is None:
            c = self._key_clients[endpoint] = KeyClient(endpoint, self.node.cluster_secret, self.node.tls)
        return c

    def _async_key_client(self, endpoint: str) -> AsyncKeyClient:
        """The running event loop's client of ``endpoint`` (its connections are that loop's)."""
        c = self._async_key_clients.get(endpoint)
        if c is None or c.loop is not asyncio.get_running_loop():
            c = self._async_key_clients[endpoint] = AsyncKeyClient(endpoint, self.node.cluster_secret, self.node.tls)
        return c

    def keeps(self, defn: Any, options: ReadOptions, keep_for: float) -> bool:
        """Whether ``gather`` with ``keep_for`` keeps partitions' answers and gives them again.
        Not for a stale read, nor for a global store: this node reads its own copies, and a
        query its store type reads together is answered whole by one partition's result, which
        is no answer of that partition alone."""
        return keep_for > 0 and self.partition_answers.max_bytes > 0 and not options.allow_stale \
            and defn is not None and not defn.is_global

    def gather(
        self,
        store: str,
        partitions_total: int,
        subqueries: list[SubQuery],
        work: OwnerWork | None,
        options: ReadOptions,
        keep_for: float = 0.0,
        known: tuple | None = None,
    ) -> Gathered:
        """Every partition's answer to its subquery. ``keep_for`` > 0: answers are kept, and
        given again for up to that many seconds without a call while the partition stays
        where it was (``PartitionAnswers``), when ``keeps`` says they can be; for queries whose
        answer depends on nothing but the partition's state. ``known``: the key
        ``known_positions`` gave the caller for this request, whose partition states are then
        not read again."""
        out = Gathered()
        pending: set[tuple[int, int]] = {
            (i, p) for i, sq in enumerate(subqueries) for p in (sq.partitions if sq.partitions is not None else range(partitions_total))
        }
        defn = self.node.stores.get(store)
        token = _token_offsets(options.bound, defn)
        states: dict[tuple[int, int], _Asked] = {}  # (subquery, partition) -> what this gather asks for
        waiting: list[_Waiting] = []  # others' calls this one shares
        try:
            if self.keeps(defn, options, keep_for):
                self._reuse_kept(out, defn, subqueries, work, pending, token, keep_for, states, waiting, known)
            self._gather(out, store, subqueries, work, options, pending, defn, token, states)
            # only now, with this gather's own answers handed on, wait for the others': two
            # gathers each waiting for the other's call before making their own would wait out
            # their deadlines
            again: set[tuple[int, int]] = set()
            for item, state, moved, other in waiting:
                left = options.deadline - time.monotonic()
                try:
                    shared = other.result(timeout=max(0.0, left) if left != math.inf else None)
                except FutureTimeout:  # the deadline came first: asked here, which fails as a timeout does
                    shared = None
                if shared is None:
                    states[item] = _Asked(state, moved, None)
                    again.add(item)
                else:
                    self._reused(out, defn, item, shared)
            if again:
                self._gather(out, store, subqueries, work, options, again, defn, token, states)
            out.position = Position().merge_all(out.positions)
            return out
        finally:  # what this gather was asking for on others' behalf: handed on, or nothing
            for (i, p), (_, _, asking) in states.items():
                if asking is None:
                    continue
                if not asking.done():
                    asking.set_result(None)
                key = (store, p, subqueries[i].query, work)
                with self._asking_lock:
                    if self._asking.get(key, (None, None))[1] is asking:
                        del self._asking[key]

    def _gather(self, out: Gathered, store: str, subqueries: list[SubQuery], work: OwnerWork | None,
                options: ReadOptions, pending: set[tuple[int, int]], defn: Any, token: dict[int, int],
                states: dict[tuple[int, int], _Asked]) -> None:
        """Ask the owners for the ``pending`` partitions' answers, into ``out``, with retries."""
        tries = _Tries()
        here = defn is not None and defn.is_global  # a global store: this node's copies answer it all
        if here and token:
            if options.at_once:
                raise NotNow("a consistency token may need a wait", sorted(token))
            self.node.wait_applied(store, token, options.deadline)  # each record applied wakes it: no backoff
        if here and self._answered_here(out, store, subqueries, work, options, pending, defn, token, states):
            return
        while pending:
            groups = self._route(store, options, pending, here, token, tries)
            local, remote = self._calls(store, subqueries, work, options, groups)
            answered = self._ask(local, remote, pending, options.deadline, tries)
            for answer in answered:
                self._take(out, answer, subqueries, work, pending, defn, token, options, states, tries)
            if not pending:
                break
            if options.at_once:
                raise NotNow("a copy cannot answer now", sorted(p for _, p in pending))
            self._back_off(store, pending, token, options.deadline, tries)

    def _answered_here(self, out: Gathered, store: str, subqueries: list[SubQuery], work: OwnerWork | None,
                       options: ReadOptions, pending: set[tuple[int, int]], defn: Any, token: dict[int, int],
                       states: dict[tuple[int, int], _Asked]) -> bool:
        """A global store's subqueries answered by this node's copies (``read_here``), with none
        of a round's routing: True when every partition answered, into ``out``. False when a
        copy may not answer (nothing taken: the rounds ask again, and say why or wait)."""
        answers = self.read_here(store, subqueries, work, options, (p for _, p in pending))
        if answers is None:
            return False
        tries = _Tries()  # where _take would note failures: these answers have none
        for i, results in enumerate(answers):
            self._take(out, _Answer(self.node.node_id, i, results), subqueries, work, pending, defn, token, options,
                       states, tries)
        return not pending

    def read_here(self, store: str, subqueries: list[SubQuery], work: OwnerWork | None, options: ReadOptions,
                  partitions: Iterable[int]) -> list[list[QueryResult]] | None:
        """A global store's subqueries (over ``partitions``) answered by this node's copies, one
        request each: each one's results, a partition each. None when a copy may not answer
        now: too far behind for ``options``, or not current (the copy says so)."""
        if local_refusals(options, partitions, functools.partial(self.node.local_lag, store)):
            return None
        answers = []
        for sq in subqueries:
            results = self.node.execute(StateQueryRequest(store, sq.query, sq.partitions, options.bound,
                                                          require_active=not options.allow_stale, work=work))
            if not all_ok(results):
                return None
            answers.append(results)
        return answers

    def _route(self, store: str, options: ReadOptions, pending: set[tuple[int, int]], here: bool,
               token: dict[int, int], tries: _Tries) -> dict[_Group, list[int]]:
        """Route every pending partition; grouped into one request per (node, subquery, whether
        it must be the active copy: not for a standby that a token sent us to)."""
        groups: dict[_Group, list[int]] = defaultdict(list)
        if here:
            self._route_here(store, options, pending, tries, groups)
            return groups
        for item in sorted(pending):
            i, p = item
            avoid = tries.avoid[item]
            targets = targets_for(self.node.view, store, p, options, frozenset(avoid), token.get(p))
            if not targets and avoid:
                # every copy it may go to failed once: after the backoff they may answer (a
                # node back at its address, a dropped connection), so ask them again
                avoid.clear()
                targets = targets_for(self.node.view, store, p, options, frozenset(), token.get(p))
            if not targets:
                tries.reasons[item] = "no node serves it (a rebalance may be under way)"
                continue
            t = targets[0]
            groups[_Group(t.node_id, (t.endpoint, t.key_endpoint), i, t.active and not options.allow_stale)].append(p)
        return groups

    def _route_here(self, store: str, options: ReadOptions, pending: set[tuple[int, int]], tries: _Tries,
                    groups: dict[_Group, list[int]]) -> None:
        """A global store's pending partitions, to this node's own copies (``_route``)."""
        refused = local_refusals(options, (p for _, p in pending), functools.partial(self.node.local_lag, store))
        here = (self.node.endpoint, None)
        group = {i: _Group(self.node.node_id, here, i, not options.allow_stale) for i in {i for i, _ in pending}}
        for item in sorted(pending):
            i, p = item
            if p in refused:
                tries.reasons[item] = refused[p]
            else:
                groups[group[i]].append(p)

    def _calls(self, store: str, subqueries: list[SubQuery], work: OwnerWork | None, options: ReadOptions,
               groups: dict[_Group, list[int]]) -> tuple[list[_Call], list[_Call]]:
        """One request per group: (those this node answers, those other nodes do)."""
        local: list[_Call] = []
        remote: list[_Call] = []
        for g, parts in groups.items():
            req = StateQueryRequest(store, subqueries[g.subquery].query, tuple(parts), options.bound,
                                    require_active=g.require_active, work=work)
            (local if g.node_id == self.node.node_id else remote).append(_Call(g.node_id, g.endpoints, g.subquery, req))
        return local, remote

    def _ask(self, local: list[_Call], remote: list[_Call], pending: set[tuple[int, int]], deadline: float,
             tries: _Tries) -> list[_Answer]:
        """Every call of one round made, this node's own part run meanwhile, and their answers;
        a node that did not answer is a reason in ``tries``, one that did not in time a Timeout."""
        sent: list[_Sent] = []
        try:
            if len(remote) == 1 and not local:
                # one call and nothing to do meanwhile: make it here, not through a pool thread
                call = remote[0]
                timeout = max(0.05, deadline - time.monotonic())
                futures = {_settled(lambda: self._query(call.node_id, call.endpoints, call.request, timeout)): call}
                answered: list[_Answer] = []
            else:
                futures = self._send_all(remote, deadline, sent)
                answered = [_Answer(c.node_id, c.subquery, self.node.execute(c.request)) for c in local]
                for s in sent:
                    futures[_settled(s.read)] = s.call
        finally:  # a call whose answer is not read leaves its connection (the thread's) unusable
            for s in sent:
                s.abandon()
        return answered + self._wait(futures, pending, deadline, tries) if futures else answered

    def _send_all(self, remote: list[_Call], deadline: float, sent: list[_Sent]) -> dict[Future, _Call]:
        """Each node's call sent from here before this node's own part runs, its answer read
        after (put in ``sent``): no pool thread is woken for it (one call per node and round; a
        second one to the same node, or one over HTTP, goes to the pool, whose futures are
        returned)."""
        futures: dict[Future, _Call] = {}
        used: set[str | None] = set()
        for call in remote:
            nid, ep, req = call.node_id, call.endpoints, call.request
            timeout = max(0.05, deadline - time.monotonic())
            try:
                answer = self._send(nid, ep, req, timeout) if ep[1] not in used else None
            except NodeCallError as e:
                futures[_failed(e)] = call
                continue
            if answer is not None:
                used.add(ep[1])
                sent.append(_Sent(answer[0], answer[1], call))
            else:  # over HTTP unless the port is busy with this node's other call
                via = ep if ep[1] in used else (ep[0], None)
                futures[self.pool.submit(self._query, nid, via, req, timeout)] = call
        return futures

    @staticmethod
    def _wait(futures: dict[Future, _Call], pending: set[tuple[int, int]], deadline: float,
              tries: _Tries) -> list[_Answer]:
        """The calls' answers; a node that did not answer leaves its partitions' reasons in
        ``tries`` (and is avoided next); when any did not answer in time, Timeout."""
        done, not_done = wait(futures, timeout=max(0.0, deadline - time.monotonic()))
        if not_done:
            names = sorted({futures[f].node_id for f in not_done})
            raise Timeout(f"nodes {', '.join(names)} did not answer in time; raise timeout_ms or retry",
                          sorted(p for (_, p) in pending))
        answered: list[_Answer] = []
        for f in done:
            call = futures[f]
            try:
                answered.append(_Answer(call.node_id, call.subquery, f.result()))
            except NodeCallError as e:
                late = time.monotonic() >= deadline
                for p in call.request.partitions or ():
                    item = (call.subquery, p)
                    if late and tries.behind.get(item) == call.node_id:
                        continue  # the deadline came while the owner waited for the token: still behind it
                    tries.reasons[item] = f"node {call.node_id} did not answer ({e})"
                    tries.avoid[item].add(call.node_id)
        return answered

    def _take(self, out: Gathered, answer: _Answer, subqueries: list[SubQuery], work: OwnerWork | None,
              pending: set[tuple[int, int]], defn: Any, token: dict[int, int], options: ReadOptions,
              states: dict[tuple[int, int], _Asked], tries: _Tries) -> None:
        """One node's answers into ``out`` (taken out of ``pending``; kept, and handed to the
        gathers waiting for them); a failure is raised, or left in ``tries`` to retry."""
        nid, i = answer.node_id, answer.subquery
        out.calls.append({"node": nid, "subquery": i, "partitions": [r.partition for r in answer.results]})
        took = False
        for r in answer.results:
            item = (i, r.partition)
            if r.failure is not None:
                self._failure(r, nid, subqueries[i], item, token, options, tries)
            elif item in pending:
                pending.discard(item)
                out.partitions.add(item)
                took = True
                if r.batch is not None:
                    out.batches.append(r.batch)
                if r.position is not None:
                    out.positions.append(r.position)
                if item in states:
                    asked = states[item]
                    kept = self._keep(defn, subqueries[i], work, r, asked.state)
                    if asked.moved and r.batch is not None:
                        out.refreshed_rows += r.batch.num_rows
                    if asked.asking is not None:
                        asked.asking.set_result(kept)
        if took:
            out.nodes.add(nid)

    @staticmethod
    def _failure(r: QueryResult, nid: str, sq: SubQuery, item: tuple[int, int], token: dict[int, int],
                 options: ReadOptions, tries: _Tries) -> None:
        """A partition's failed answer: raised when retrying cannot help, else its reason kept."""
        assert r.failure is not None, "a failed answer names its failure"
        if r.failure is FailureReason.UNKNOWN_QUERY_TYPE:
            raise UnknownQueryType(sq.query.type_name, nid, r.message)
        if r.failure is FailureReason.STORE_EXCEPTION and r.code == NOT_COLOCATED:
            raise NotColocated(f"partition {r.partition}: {r.message}", [r.partition])
        if r.failure not in RETRYABLE:
            # the caller tells the request's own errors (its SQL, its data) by the code
            raise OwnerFailed(r.partition, nid, r.failure, r.message, r.code)
        tries.reasons[item] = f"{r.failure.value} on node {nid}: {r.message}"
        if r.failure is FailureReason.NOT_UP_TO_BOUND:
            tries.behind[item] = nid
            return
        tries.behind.pop(item, None)
        if options.allow_stale or r.partition in token:
            tries.avoid[item].add(nid)  # another copy may answer: try it next

    def _back_off(self, store: str, pending: set[tuple[int, int]], token: dict[int, int], deadline: float,
                  tries: _Tries) -> None:
        """Wait before the next round (failing when the deadline comes first), then let every
        partition try the nodes it avoided too often again: every one may have moved on. When
        every partition waits only for its copy to reach the consistency token, the round comes
        as soon as the copies say they have (``_reached``)."""
        if time.monotonic() + tries.delay >= deadline:
            self._fail(pending, tries.reasons)
        until = time.monotonic() + tries.delay
        if not self._reached(store, pending, token, tries, until):
            time.sleep(max(0.0, until - time.monotonic()))
        tries.delay = min(tries.delay * 2, 0.4)
        for item in pending:
            if len(tries.avoid[item]) > 2:
                tries.avoid[item].clear()

    def _reached(self, store: str, pending: set[tuple[int, int]], token: dict[int, int], tries: _Tries,
                 until: float) -> bool:
        """Whether the copies that were behind the token for every pending partition have
        reached it, waiting until ``until`` at most: this node's own as it applies records,
        another node's as its positions watch says."""
        behind = {p: tries.behind.get((i, p)) for i, p in pending}
        if not behind or None in behind.values() or any(p not in token for p in behind):
            return False
        for p, nid in behind.items():
            if nid == self.node.node_id:
                self.node.wait_applied(store, {p: token[p]}, until)
                known = self.node.answerable_offsets_of(store, (p,))
                if known is None or known[1][0] < token[p]:
                    return False
                continue
            info = self.node.view.get(nid)
            if info is None or info.key_endpoint is None \
                    or not self._watch(info.key_endpoint).wait_reached(store, p, token[p], until):
                return False
        return True

    def known_positions(self, stores: list[Any]) -> tuple[tuple, Position] | None:
        """Where every partition of ``stores`` (definitions) is now, as far as this node knows
        without asking: its own partitions from its shards, the others' from their owners'
        positions watches. (a key naming each partition's state: its owner's epoch and offset;
        the offsets as a Position), or None when any partition's is not known so (no active
        owner in the view, one without a key port, not heard from lately, not answering it
        as its current active copy). The first ask for a node opens its watch."""
        live = self.node.view.live()
        key: list[tuple] = []
        offsets: dict[str, dict[int, int]] = {}
        for defn in stores:
            parts = offsets.setdefault(defn.topic, {})
            if defn.is_global:  # this node's own copies, every partition at once
                here = self.node.answerable_offsets_of(defn.name, range(defn.partitions))
                if here is None:
                    return None
                epoch, at = here
                key.extend((defn.name, p, None, (epoch, o)) for p, o in enumerate(at))
                parts.update((p, o) for p, o in enumerate(at) if o >= 0)
                continue
            owners = _active_owners(live, defn.name)
            for p in range(defn.partitions):
                state = self._state(defn.name, p, owners.get(p))
                if state is None:
                    return None
                key.append((defn.name, p, *state))
                if state[1][1] >= 0:
                    parts[p] = state[1][1]
        return tuple(key), Position(offsets)

    def _owners(self, live: list[Any], defn: Any) -> dict[int, Any]:
        """partition -> the node that answers it as its active copy: for a global store this
        node, for every partition."""
        if defn.is_global:
            here = _Here(self.node.node_id)
            return {p: here for p in range(defn.partitions)}
        return _active_owners(live, defn.name)

    def _state(self, store: str, partition: int, owner: Any) -> tuple[str | None, tuple[Any, int]] | None:
        """(whose watch says it: None for this node's own shards, (epoch, offset)) of a partition
        whose active owner is ``owner``, or None when that is not known without asking."""
        if owner is None:
            return None
        if owner.node_id == self.node.node_id:
            known = self.node.answerable_offsets_of(store, (partition,))
            return None if known is None else (None, (known[0], known[1][0]))
        if owner.key_endpoint is None:
            return None
        watch = self._watch(owner.key_endpoint)
        said = watch.offset(store, partition)
        return None if said is None else (watch.endpoint, said)

    def _reuse_kept(self, out: Gathered, defn: Any, subqueries: list[SubQuery], work: OwnerWork | None,
                    pending: set[tuple[int, int]], token: dict[int, int], keep_for: float,
                    states: dict[tuple[int, int], _Asked], waiting: list[_Waiting], known: tuple | None) -> None:
        """Answer from kept answers the pending partitions still where they were, and put in
        ``waiting`` the ones another gather is asking for at the same state (both taken out of
        ``pending``). For the others, in ``states``: their states now, to keep their answers
        by; whether an answer was kept at another state (the partition moved; not one only too
        old); and the future through which this gather hands its answer to those that wait."""
        given = {(name, p): (endpoint, at) for name, p, endpoint, at in known or () if name == defn.name}
        owners: dict[int, Any] | None = None
        for item in sorted(pending):
            i, p = item
            state = given.get((defn.name, p))
            if state is None:
                if owners is None:
                    owners = self._owners(self.node.view.live(), defn)
                state = self._state(defn.name, p, owners.get(p))
            if state is None:
                continue
            key = (defn.name, p, subqueries[i].query, work)
            was = self.partition_answers.state_of(key)  # kept at another state: this partition moved since
            kept = self.partition_answers.get(key, state, keep_for)
            wanted = token.get(p)
            moved = was is not None and was != state
            if kept is None and wanted is None:
                with self._asking_lock:
                    asked = self._asking.get(key)
                    if asked is not None and asked[0] == state:
                        waiting.append(_Waiting(item, state, moved, asked[1]))
                        pending.discard(item)
                        continue
                    asking: Future = Future()
                    self._asking[key] = (state, asking)
                states[item] = _Asked(state, moved, asking)  # asked here: kept again if the owner was still there
            elif kept is None or (wanted is not None and (kept[0] is None or kept[0] < wanted)):
                states[item] = _Asked(state, moved, None)
            else:
                self._reused(out, defn, item, kept)
                pending.discard(item)

    @staticmethod
    def _reused(out: Gathered, defn: Any, item: tuple[int, int], kept: tuple[int | None, pa.RecordBatch | None]) -> None:
        """``item`` answered without a call of this gather's: ``kept`` (offset, batch)."""
        out.partitions.add(item)
        out.reused += 1
        if kept[1] is not None:
            out.batches.append(kept[1])
        if kept[0] is not None:
            out.positions.append(Position.of(defn.topic, item[1], kept[0]))

    def _keep(self, defn: Any, sq: SubQuery, work: OwnerWork | None, r: QueryResult,
              state: tuple) -> tuple[int | None, pa.RecordBatch | None] | None:
        """Keep an owner's answer if it was computed at the state known before the call; (its
        offset, its batch) when it was."""
        offset = r.position.get(defn.topic, r.partition) if r.position is not None else None
        if offset != (state[1][1] if state[1][1] >= 0 else None):
            return None
        self.partition_answers.put((defn.name, r.partition, sq.query, work), state, offset, r.batch)
        return offset, r.batch

    def _watch(self, key_endpoint: str) -> PositionWatch:
        w = self._watches.get(key_endpoint)
        if w is None or w.closed:
            with self._watches_lock:
                w = self._watches.get(key_endpoint)
                if w is None or w.closed:
                    w = self._watches[key_endpoint] = PositionWatch(key_endpoint, self.node.cluster_secret,
                                                                    self.node.tls)
        return w

    def read_key(self, store: str, partition: int, key: bytes, options: ReadOptions) -> StoredEntry | None:
        """The point lookup's one call: ``key``'s stored entry from the partition's active
        owner elsewhere, as that node's ``read_local`` gives it; None when it is not to be had
        so at once (see ``key_call``; the owner cannot answer it so, or does not answer): the
        caller takes ``gather``, with its retries and its errors."""
        call = self.key_call(store, partition, options)
        if call is None:
            return None
        started = perf_counter()
        entry = self._key_client(call.key_endpoint).read_key(store, call.topic, partition, key, call.at, call.timeout)
        return self._key_read(call, entry, started)

    async def read_key_soon(self, call: KeyCall, key: bytes) -> StoredEntry | None:
        """``read_key``'s call (``key_call``) made on the running event loop, without a thread."""
        started = perf_counter()
        entry = await self._async_key_client(call.key_endpoint).read_key(
            call.store, call.topic, call.partition, key, call.at, call.timeout)
        return self._key_read(call, entry, started)

    def key_call(self, store: str, partition: int, options: ReadOptions) -> KeyCall | None:
        """Where ``read_key`` asks for a key of ``partition``: its active owner's key port, when
        that is another node's and there is time left; None when there is no such call (no owner
        in the view, the owner is this node, a global store, the deadline passed)."""
        defn = self.node.stores.get(store)
        if defn is None or defn.is_global:  # a global store's keys are read here or not at all
            return None
        token = _token_offsets(options.bound, defn)
        targets = targets_for(self.node.view, store, partition, options, frozenset(), token.get(partition))
        if not targets:
            return None
        t = targets[0]
        if not t.active or t.key_endpoint is None or t.node_id == self.node.node_id:
            return None
        timeout = options.deadline - time.monotonic()
        if timeout <= 0:
            return None
        return KeyCall(t.node_id, t.key_endpoint, store, defn.topic, partition, token.get(partition), min(timeout, 10.0))

    def _key_read(self, call: KeyCall, entry: StoredEntry | None, started: float) -> StoredEntry | None:
        if self.metrics is not None:  # FALLBACK: the owner could not answer so; the general path follows
            self.metrics.internal_call(call.node_id, "key", "ok" if entry is not None else "FALLBACK",
                                       perf_counter() - started)
        return entry

    @staticmethod
    def _fail(pending: set[tuple[int, int]], reasons: dict[tuple[int, int], str]) -> None:
        parts = sorted({p for _, p in pending})
        why = "; ".join(f"partition {p}: {reasons.get((i, p), 'no answer')}" for i, p in sorted(pending))
        if all("NOT_UP_TO_BOUND" in reasons.get(item, "") for item in pending):
            raise NotUpToBound(f"partitions {parts} have not caught up with the consistency token in time: {why}; "
                               "retry, or raise timeout_ms", parts)
        raise Unavailable(f"partitions {parts} are unavailable: {why}; retry shortly, or pass "
                          "allow_stale to read a standby", parts)


class KeyCall(NamedTuple):
    """The point lookup's call to the owner of a key's partition (``Dispatcher.key_call``)."""

    node_id: str
    key_endpoint: str
    store: str
    topic: str
    partition: int
    at: int | None  # the changelog offset the consistency token asks for
    timeout: float  # seconds


@dataclass(frozen=True)
class _Here:
    """This node, as the owner of a global store's partitions (``_state`` reads its own copies)."""

    node_id: str


def _active_owners(live: list[Any], store: str) -> dict[int, Any]:
    """partition -> the node the view says answers it as its active copy."""
    owners: dict[int, Any] = {}
    for n in live:
        for p in n.active.get(store, ()):
            owners.setdefault(p, n)
    return owners


def _token_offsets(bound: PositionBound, defn: Any) -> dict[int, int]:
    """partition -> the changelog offset the consistency token asks this store for."""
    if bound.position is None or defn is None:
        return {}
    return bound.position.partitions(defn.topic)


def _settled(call: Callable[[], list[QueryResult]]) -> Future:
    """``call()``'s answer or exception, as a done future: read back exactly as a pooled call's."""
    f: Future = Future()
    try:
        f.set_result(call())
    except Exception as e:  # noqa: BLE001 - the reader raises it
        f.set_exception(e)
    return f


def _failed(e: BaseException) -> Future:
    f: Future = Future()
    f.set_exception(e)
    return f


def _outcome(e: NodeCallError) -> str:
    return e.code or (f"HTTP_{e.status}" if e.status else "NO_ANSWER")
