"""Shard answers: a store layer that answers a repeated query from the answer it computed at
the same write sequence (``federator node --shard-answers``).

A leaderboard's top-10 or a player's rank asked again and again of a partition nobody wrote
to is the same answer each time, yet each time the owner walked its index and built the
batch again. This layer keeps a small answer under its query until the shard's next write.

Exact by the shard's write sequence (Shard.consistent): an answer is kept under the even
sequence read before it was computed, and given again only while the sequence is still that
one. Then no write has begun since, so the shard holds what it held when the answer was read
(had a write landed before that read, the sequence would have moved), and the position kept
with it is the shard's. A write moves the sequence, and the next ask computes again.
Full scans are the scan cache's (federator.store.scan_cache), point lookups cost less than
keeping them; both pass down, as do a query asked with execution info (which reports the
read it made) and a query type that says its answer depends on more than the data
(``Query.reusable``)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import pyarrow as pa

from federator.query.position import Position, PositionBound
from federator.query.queries import Query
from federator.query.result import QueryResult
from federator.settings import SHARD_ANSWER_MAX_BYTES, NodeSettings
from federator.store.layer import UNBOUNDED, LocalKeyQuery, StoreLayer, WrappedLayer

DEFAULT_PER_SHARD = NodeSettings.shard_answers  # answers kept per store partition (--shard-answers); 0 turns the layer off
MAX_ANSWER_BYTES = SHARD_ANSWER_MAX_BYTES  # a larger answer is a scan's kind, and costs more to keep than to read


class ShardAnswers:
    """What a node's shard-answer layers share: the limit per shard and the counts reported
    (GET /v1/metadata ``local.kept_answers``, the ``federator_kept_answers_*`` metrics: the names
    they were published under, which dashboards read)."""

    def __init__(self, per_shard: int = DEFAULT_PER_SHARD, max_bytes: int = MAX_ANSWER_BYTES) -> None:
        self.per_shard, self.max_bytes = per_shard, max_bytes
        self.hits = 0
        self.computed = 0

    def stats(self) -> dict[str, int]:
        return {"per_shard": self.per_shard, "hits": self.hits, "computed": self.computed}


class ShardAnswersLayer(WrappedLayer):
    """Answers a query it answered before at the shard's current write sequence from that
    answer; computes (passing down) and keeps it otherwise."""

    def __init__(self, inner: StoreLayer, kept: ShardAnswers) -> None:
        super().__init__(inner)
        self.kept = kept
        self._shard: Any = inner.base
        self._answers: OrderedDict[Query, tuple[int, pa.RecordBatch, Position]] = OrderedDict()
        self._lock = threading.Lock()

    def run(self, query: Query, bound: PositionBound = UNBOUNDED, collect_execution_info: bool = False) -> Any:
        shard = self._shard
        if (collect_execution_info or type(query) is LocalKeyQuery or not getattr(query, "reusable", False)
                or shard.store_type.is_full_scan(query)):
            return self.inner.run(query, bound, collect_execution_info)
        try:
            hash(query)
        except TypeError:  # a plugin's query with a list field: computed each time
            return self.inner.run(query, bound, False)
        seq = shard.seq
        with self._lock:
            hit = self._answers.get(query)
            if hit is not None and hit[0] == seq and not seq & 1 \
                    and bound.is_satisfied_by(hit[2], shard.topic, shard.partition):
                self._answers.move_to_end(query)
                self.kept.hits += 1
                return QueryResult.success(self.partition, hit[1], hit[2])
            self.kept.computed += 1
        result = self.inner.run(query, bound, False)
        # not kept when a write began meanwhile: the sequence moved on, so it would never be given
        if result.ok and result.batch is not None and not seq & 1 and shard.seq == seq \
                and result.batch.get_total_buffer_size() <= self.kept.max_bytes:
            with self._lock:
                self._answers[query] = (seq, result.batch, result.position)
                self._answers.move_to_end(query)
                while len(self._answers) > self.kept.per_shard:
                    self._answers.popitem(last=False)
        return result

    def reset(self, source: str | None = None) -> None:
        self.inner.reset(source)
        with self._lock:
            self._answers.clear()

