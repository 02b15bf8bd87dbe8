"""A global store's queries answered from every partition at once (``StoreType.together_handlers``):
the node asked holds all of them, so a query that needs each partition's part (a rank counts
the rows before a score in each) is one read of them all, not a round of calls a partition at
a time. All or nothing: one partition refused refuses them all, as a part alone answers nothing."""

from __future__ import annotations

import functools
import operator

from federator.query.position import Position, PositionBound
from federator.query.queries import Query
from federator.query.result import QueryResult
from federator.store.layer import answer, unmet_bound
from federator.store.shard import Shard, TogetherReads, read_together
from federator.store.types import TogetherFollower, TogetherHandler


def answer_together(shards: list[Shard], query: Query, bound: PositionBound, handler: TogetherHandler,
                    kept: TogetherReads) -> list[QueryResult]:
    """One result a partition: the first carries the answer and the Position it read of every
    partition (``kept`` holds the last read's views and merges the Positions once for the same
    states), the others neither."""
    read_at: list[Position] = []

    def read():
        batch, positions = read_together(shards, lambda views: handler(views, query), kept=kept)
        read_at.extend(positions)
        return batch, kept.merged.of(positions)

    first = answer(shards[0], query, bound, False, read)
    if not first.ok:
        return [first, *(together_refused(s.partition, first) for s in shards[1:])]
    # each partition's state, read with the first's, checked against the bound too (none: nothing to check)
    unmet = [] if bound.is_unbounded else \
        [u for s, at in zip(shards, read_at) if (u := unmet_bound(s, bound, at)) is not None]
    if unmet:
        refused = {u.partition for u in unmet}
        return unmet + [together_refused(s.partition, unmet[0]) for s in shards if s.partition not in refused]
    assert first.batch is not None, "an answer carries its rows"
    return [first, *map(_in_the_first, map(_PARTITION, shards[1:]))]  # in C: a read answers thousands a second


_PARTITION = operator.attrgetter("partition")


@functools.cache
def _in_the_first(partition: int) -> QueryResult:
    """Partition ``partition``'s result when its rows and position are in the first's: one
    object a partition, shared (nothing sets a field of a result without rows or failure)."""
    return QueryResult(partition)


def together_refused(partition: int, why: QueryResult) -> QueryResult:
    """Partition ``partition``'s failure when partition ``why.partition``, read with it, failed."""
    assert why.failure is not None, "only a failure refuses the others"
    return QueryResult.failed(partition, why.failure,
                              f"read together with partition {why.partition}, which failed: {why.message}", why.code)


def unchanged_since(shards: list[Shard], query: Query, since: list[int], follower: TogetherFollower) -> bool:
    """Whether ``query`` answers now, from every partition read in one state, what it answered
    when each was at its offset in ``since`` (``follower``: the store type's judge)."""
    return read_together(shards, lambda views: follower(views, query, since))[0]
