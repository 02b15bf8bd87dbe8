"""Statements' answers kept at the node they were asked of: a deterministic statement over
partitions at the same positions reads the same rows, so a repeated one over unchanged stores
(a dashboard's refresh) is answered again without reading or DuckDB's fixed cost; and one
whose store types tell that the writes since left its answer as it was (a top-10 no new score
reached) is followed to the new positions (``KeptAnswers.followed``)."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any, Callable, Iterator, NamedTuple

import pyarrow as pa

from federator.catalog.definition import StoreDefinition
from federator.query.position import Position, PositionBound
from federator.query.rows import Rows
from federator.settings import STATEMENT_ANSWER_MAX_BYTES
from federator.sql.answers import AT_ONCE_MAX_BYTES, AT_ONCE_ROWS, Answer
from federator.sql.planner import QueryPlan

# larger answers cost more to keep than DuckDB's fixed cost saves
ANSWER_MAX_BYTES = STATEMENT_ANSWER_MAX_BYTES


class Known(NamedTuple):
    """Where every partition of some stores is now, as far as this node knows without asking
    (``Dispatcher.known_positions``)."""

    key: tuple  # each partition's state: its owner's epoch and offset
    at: Position  # the offsets


class Watch(NamedTuple):
    """A statement over stores whose partitions' positions are known: its answer's name there."""

    key: tuple  # the answer at ``known``'s positions
    known: Known
    stores: list[StoreDefinition]  # every store it reads


class KeptAnswer(NamedTuple):
    """A statement's answer kept at the receiver."""

    when: float  # time.monotonic() when kept
    identity: Any  # the plan it answers (``QueryPlan.identity``)
    schema: pa.Schema
    batches: list[pa.RecordBatch]
    at: Position | None  # the positions it was kept at, when known
    rows: Rows | None = None  # the answer as Python values (then ``batches`` is empty)

    def answer(self) -> Answer:
        return self.rows if self.rows is not None else (self.schema, iter(self.batches))

    def small(self) -> bool:
        """Whether it is small enough to give on the HTTP server's event loop."""
        if self.rows is not None:
            return self.rows.num_rows <= AT_ONCE_ROWS
        # the buffers it holds, read without walking them (nbytes walks them, and lets the GIL go)
        return sum(b.get_total_buffer_size() for b in self.batches) <= AT_ONCE_MAX_BYTES


class KeptAnswers:
    """The node's kept answers: by (plan key, positions read, partitions read), or by the
    watched positions a statement was answered at (``Watch.key``); the latest of those per
    statement is what ``followed`` may carry on."""

    def __init__(self, reuse_seconds: float, most: int,
                 unchanged_since: Callable[[str, Any, Position], bool]) -> None:
        """``reuse_seconds``: how long an answer is given again (--reuse-answers-seconds);
        ``most``: how many are kept (--statement-answers; 0 keeps none); ``unchanged_since``:
        the node's judge of whether a store's query answers now what it did at a Position."""
        self._reuse_seconds = reuse_seconds
        self._most = most
        self._unchanged_since = unchanged_since
        self._answers: OrderedDict[tuple, KeptAnswer] = OrderedDict()
        # plan key -> the answer last kept at watched positions, with the partitions' states it
        # was kept at: what may follow writes that do not reach it (``followed``)
        self._latest: OrderedDict[tuple, tuple[tuple, KeptAnswer]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple, plan: QueryPlan) -> KeptAnswer | None:
        """The answer kept for ``key``, while it is ``plan``'s and young enough."""
        with self._lock:
            kept = self._answers.get(key)
            if kept is None:
                return None
            if kept.identity is not plan.identity or time.monotonic() - kept.when > self._reuse_seconds:
                del self._answers[key]
                return None
            return kept

    def keeping(self, key: tuple | None, plan: QueryPlan, answer: Answer, at: Position | None) -> Answer:
        """``answer``, kept as ``key``'s answer at ``at`` (batches as they stream out; as it
        is when ``key`` is None)."""
        if key is None or self._most == 0:
            return answer
        if isinstance(answer, Rows):
            if answer.num_rows <= AT_ONCE_ROWS:
                self.keep(key, KeptAnswer(time.monotonic(), plan.identity, answer.schema, [], at, answer))
            return answer
        schema, batches = answer
        return schema, self.kept(key, plan, schema, batches, at)

    def kept(self, key: tuple, plan: QueryPlan, schema: pa.Schema,
             batches: Iterator[pa.RecordBatch], at: Position | None = None) -> Iterator[pa.RecordBatch]:
        """The batches as they stream out, kept as the answer for ``key`` if it is small and whole."""
        kept: list[pa.RecordBatch] | None = []
        size = 0
        for batch in batches:
            if kept is not None:
                # the buffers it holds alive, whole (a slice of a larger batch holds all of it),
                # and read without walking them as nbytes does
                size += batch.get_total_buffer_size()
                if size <= ANSWER_MAX_BYTES:
                    kept.append(batch)
                else:
                    kept = None
            yield batch
        if kept is not None:
            self.keep(key, KeptAnswer(time.monotonic(), plan.identity, schema, kept, at))

    def keep(self, key: tuple, kept: KeptAnswer) -> None:
        with self._lock:
            self._answers[key] = kept
            while len(self._answers) > self._most:
                self._answers.popitem(last=False)
            if key[1] == "watched" and kept.at is not None:
                self._latest[key[0]] = (key[2], kept)
                self._latest.move_to_end(key[0])
                while len(self._latest) > self._most:
                    self._latest.popitem(last=False)

    def followed(self, plan: QueryPlan, watch: Watch) -> KeptAnswer | None:
        """The answer last kept for ``plan`` at earlier positions, when its stores' types say no
        write since changed it (a top-10 that no new score reached): kept again at the watched
        positions, whose answer it is, so its token names them."""
        if not followable(plan):
            return None
        with self._lock:
            states, latest = self._latest.get(watch.key[0], ((), None))
        if latest is None or latest.at is None or latest.identity is not plan.identity \
                or time.monotonic() - latest.when > self._reuse_seconds or not same_epochs(states, watch.known.key):
            return None
        if not all(self._unchanged_since(ref.store.name, sq.query, latest.at)
                   for ref in plan.refs for sq in ref.subqueries):
            return None
        moved = latest._replace(at=watch.known.at)
        self.keep(watch.key, moved)
        return moved


def same_epochs(then: tuple, now: tuple) -> bool:
    """Whether each partition's state (Dispatcher.known_positions: store, partition, whose,
    (epoch, offset)) is of the same epoch in both: an offset names a state only within one
    (a copy rebuilt from a changelog created again starts its offsets over)."""
    return len(then) == len(now) and all(a[:3] == b[:3] and a[3][0] == b[3][0] for a, b in zip(then, now))


def followable(plan: QueryPlan) -> bool:
    """Whether ``plan`` reads only global stores, with queries whose store type can tell that
    writes left their answer as it was, and nothing besides them (no rule's rows)."""
    return bool(plan.refs) and not plan.local and all(
        ref.store.is_global and ref.combine is None and ref.work.sql is None and ref.joined is None
        and all(type(sq.query) in ref.store.store_type.together_followers for sq in ref.subqueries)
        for ref in plan.refs)


def reaches(known: Position, bound: PositionBound) -> bool:
    """Whether partitions at ``known`` satisfy ``bound`` (a consistency token's offsets)."""
    if bound.position is None:
        return True
    return all((-1 if (k := known.get(t, p)) is None else k) >= o for t, p, o in bound.position)


def stores_read(plan: QueryPlan, stores: dict[str, StoreDefinition]) -> list[StoreDefinition] | None:
    """Every store ``plan`` reads: its references' and the stores their owners join them with
    (read beside them, named only by ``joined``); None when one of those is not defined now."""
    out = {ref.store.name: ref.store for ref in plan.refs}
    for ref in plan.refs:
        if ref.joined is not None:
            other = stores.get(ref.joined)
            if other is None:
                return None
            out[other.name] = other
    return list(out.values())
