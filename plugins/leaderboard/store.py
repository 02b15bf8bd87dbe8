"""The ``leaderboard`` store type: player → score, with a score-ordered index in the same shard.

Data lives in the default column family exactly as in a kv store (so key lookups and
scans are the kv handlers); the index lives in the ``by_score`` column family as
``sortable(score) + key`` → empty, written in the same atomic batch as the data and
the shard's position, so the two can never disagree.
"""

from __future__ import annotations

import struct
from typing import Any, Iterable

import numpy as np
import pyarrow as pa
from rocksdict import WriteBatch

from federator.catalog.definition import DefinitionError, StoreDefinition
from federator.store.arrow import build_batch, empty_batch
from federator.store.kv import KeyValueStoreType
from federator.store.record import ChangelogRecord
from federator.store.view import ShardView
from federator.store.types import stored_value

from federator_plugins.leaderboard.queries import RankQuery, ScoreIndexQuery, TopKQuery

INDEX = "by_score"
SORTABLE = "__sortable"  # ScoreIndexQuery's column: each row's score as the index orders it
TOO_MANY = b"too_many"  # ScoreIndexQuery's schema metadata when the partition has more rows than asked
SCORE_FORMATS = ("long", "int", "double")
_U64 = struct.Struct(">Q")
_SIGN = 1 << 63


def sortable(fmt: str, score: Any) -> bytes:
    """8 bytes whose byte order is the scores' numeric order."""
    if fmt == "double":
        bits = _U64.unpack(struct.pack(">d", float(score) + 0.0))[0]  # + 0.0: -0.0 ranks as 0.0
        # positives: set the sign bit; negatives: flip every bit (bigger magnitude sorts lower)
        return _U64.pack(bits ^ 0xFFFF_FFFF_FFFF_FFFF if bits & _SIGN else bits | _SIGN)
    return _U64.pack(int(score) + _SIGN)


def top_k(view: ShardView, q: TopKQuery) -> pa.RecordBatch:
    keys: list[bytes] = []
    stored: list[bytes] = []
    last: bytes | None = None
    if q.k > 0:
        for entry, _ in view.scan(reverse=q.descending, family=INDEX):
            prefix = entry[:8]
            if len(keys) >= q.k and prefix != last:
                break
            value = view.get(entry[8:])
            if value is None:  # cannot happen while data and index are written together
                continue
            keys.append(entry[8:])
            stored.append(value)
            last = prefix
    if not keys:
        return empty_batch(view.schema)
    return build_batch(view.schema, view.definition, keys, stored)


RANK_SCHEMA = pa.schema([pa.field("i", pa.int64()), pa.field("better", pa.int64())])  # i: index into scores


def sorted_scores(view: ShardView) -> np.ndarray:
    """Every index entry's sortable score as a uint64, ascending (the index's own order), kept
    by the shard until its next write: a rank is then a binary search, not a walk over every
    better entry (which cost a rank query milliseconds per partition in Python)."""
    def build() -> np.ndarray:
        prefixes = b"".join(entry[:8] for entry, _ in view.scan(family=INDEX, fill_cache=False))
        return np.frombuffer(prefixes, dtype=">u8").astype(np.uint64)
    return view.kept("leaderboard.sorted_scores", build)


def rank(view: ShardView, q: RankQuery) -> pa.RecordBatch:
    fmt = view.definition.value_format
    scores = sorted_scores(view)
    better = []
    for score in q.scores:
        value = np.uint64(_U64.unpack(sortable(fmt, view.definition.value.coerce(score)))[0])
        if q.descending:  # entries with a higher score
            n = len(scores) - int(np.searchsorted(scores, value, side="right"))
        else:  # entries with a lower one
            n = int(np.searchsorted(scores, value, side="left"))
        better.append(n)
    return pa.RecordBatch.from_arrays(
        [pa.array(range(len(better)), pa.int64()), pa.array(better, pa.int64())], schema=RANK_SCHEMA
    )


def score_index(view: ShardView, q: ScoreIndexQuery) -> pa.RecordBatch:
    count = len(sorted_scores(view))
    if count > q.max_rows:
        schema = view.schema.append(pa.field(SORTABLE, pa.uint64())).with_metadata({TOO_MANY: str(count).encode()})
        return pa.RecordBatch.from_pylist([], schema=schema)

    def build() -> pa.RecordBatch:
        keys: list[bytes] = []
        stored: list[bytes] = []
        prefixes: list[bytes] = []
        for entry, _ in view.scan(family=INDEX, fill_cache=False):
            value = view.get(entry[8:])
            if value is None:  # cannot happen while data and index are written together
                continue
            prefixes.append(entry[:8])
            keys.append(entry[8:])
            stored.append(value)
        rows = build_batch(view.schema, view.definition, keys, stored) if keys else empty_batch(view.schema)
        sortables = np.frombuffer(b"".join(prefixes), dtype=">u8").astype(np.uint64)
        return rows.append_column(SORTABLE, pa.array(sortables, pa.uint64()))
    return view.kept("leaderboard.score_index", build)


class LeaderboardStoreType(KeyValueStoreType):
    name = "leaderboard"
    column_families = (INDEX,)
    handlers = {**KeyValueStoreType.handlers, TopKQuery: top_k, RankQuery: rank, ScoreIndexQuery: score_index}

    def validate(self, defn: StoreDefinition) -> None:
        if defn.value_format not in SCORE_FORMATS:
            raise DefinitionError(
                f"a leaderboard store keeps one numeric score per key: field 'value.format' must be one of "
                f"{', '.join(SCORE_FORMATS)}, got {defn.value_format!r}"
            )

    def apply(self, wb: WriteBatch, records: Iterable[ChangelogRecord], shard: ShardView) -> None:
        defn = shard.definition
        fmt, value_fmt, index = defn.value_format, defn.value, shard.handle(INDEX)
        latest: dict[bytes, bytes | None] = {}  # what this batch has written so far, key -> stored

        def score_of(stored: bytes) -> Any:
            return value_fmt.deserialize(stored[8:])

        for r in records:
            old = latest[r.key] if r.key in latest else shard.get(r.key)
            if old is not None:
                wb.delete(sortable(fmt, score_of(old)) + r.key, index)
            if r.value is None:
                wb.delete(r.key)
                latest[r.key] = None
            else:
                stored = stored_value(r)
                wb.put(r.key, stored)
                wb.put(sortable(fmt, score_of(stored)) + r.key, b"", index)
                latest[r.key] = stored
