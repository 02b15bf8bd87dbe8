"""The ``leaderboard`` store type: player → score, with a score-ordered index in the same shard.

Data lives in the default column family exactly as in a kv store (so key lookups and
scans are the kv handlers); the index lives in the ``by_score`` column family as
``sortable(score) + key`` → empty, written in the same atomic batch as the data and
the shard's position, so the two can never disagree. In memory each shard keeps the same
index as an order-statistics structure (federator_plugins.leaderboard.index), read from
``by_score`` when the shard opens and changed by the same write as the data, from which
top-k, ranks and the rows around a player are answered in O(log n).
"""

from __future__ import annotations

import bisect
import functools
import itertools
import operator
import struct
from typing import Any, Callable, Iterable, Mapping

import numpy as np
import pyarrow as pa
from rocksdict import WriteBatch
from sortedcontainers import SortedList

from federator.catalog.definition import DefinitionError, StoreDefinition
from federator.partitioner import partition_for
from federator.store.arrow import build_batch
from federator.query.queries import KeysQuery
from federator.query.rows import Rows, empty_batch
from federator.store.kv import KeyValueStoreType, keys_query
from federator.store.record import ChangelogRecord
from federator.store.view import ShardView
from federator.store.types import stored_value

from federator_plugins.leaderboard.index import (Order, ScoreIndex, TogetherIndex, around, before, distinct_better,
                                                 entry, key_order, nth, score_of, top, together)
from federator_plugins.leaderboard.queries import (AroundQuery, PlacesQuery, PlayerRanksQuery, RankQuery,
                                                   RanksAroundQuery, ScoresQuery, TopKQuery)

INDEX = "by_score"
ENTRY = "__entry"  # AroundQuery's column: each row's index entry
# what RankQuery and AroundQuery say beside the rows, in rows whose store columns are null
PLACE, COUNT, SCORE, BEFORE, AFTER = "__place", "__count", "__score", "__before", "__after"
RANK = "__rank"  # PlayerRanksQuery's column, and RanksAroundQuery's
ANCHOR = "__anchor_rank"  # RanksAroundQuery's column: the player's rank the rows were chosen around
RANK_FIELDS = [pa.field(PLACE, pa.int64()), pa.field(COUNT, pa.int64()), pa.field(SCORE, pa.uint64())]
ROWS = "__rows"  # PlacesQuery's: how many rows the partition holds
PLACES_FIELDS = [*RANK_FIELDS, pa.field(ROWS, pa.int64())]
SCORES_SCHEMA = pa.schema([pa.field(SCORE, pa.uint64())])  # ScoresQuery's answer
_SCORE_BYTES = operator.itemgetter(slice(0, 8))  # an index entry's sortable score, as the entry starts with it
AROUND_FIELDS = [pa.field(BEFORE, pa.int64()), pa.field(AFTER, pa.int64()), pa.field(SCORE, pa.uint64())]
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


_index: Callable[[ShardView], ScoreIndex] = operator.attrgetter("memory")  # in C: a rank takes every partition's


def _rows(view: ShardView, entries: list[bytes]) -> pa.RecordBatch:
    """The rows of index entries, in their order (read in the same consistent read)."""
    defn = view.definition
    order = key_order(defn.key_format)
    keys = [order(e[8:]) for e in entries]
    if not keys:
        return empty_batch(view.schema)
    return build_batch(view.schema, defn, keys, [view.get(k) for k in keys])  # type: ignore[arg-type]


def _entries(view: ShardView, span: Callable[[Any], tuple[int, int]], descending: bool) -> tuple[list[bytes], int, int]:
    """The entries of the span ``span(entries)`` picks, best first, with how many entries lie
    below it (lower scores) and above it."""
    index = _index(view)
    with index.lock:
        lo, hi = span(index.entries)
        picked = list(index.entries.islice(lo, hi, reverse=descending))
        return picked, lo, len(index.entries) - hi


def top_k(view: ShardView, q: TopKQuery) -> pa.RecordBatch:
    return _rows(view, _best(view, q))


def _best(view: ShardView, q: TopKQuery) -> list[bytes]:
    """The partition's entries of its ``q.k`` best (with the ties at the cut), best first:
    kept until its next write, as a top-k is asked again and again between two writes."""
    return view.kept(f"top {q.k} {q.descending} {q.distinct}", lambda: _entries(
        view, lambda entries: top(entries, q.k, q.descending, q.distinct), q.descending)[0])


def top_k_together(views: list[ShardView], q: TopKQuery) -> Rows:
    """A global leaderboard's k best rows (with the ties at the cut) over every partition:
    each partition's best, merged and cut as one index would be."""
    bests = [_best(view, q) for view in views]
    merged, lo, hi = _merged_top(bests, q)
    home: dict[bytes, ShardView] = {}
    for view, best in zip(views, bests):
        home.update(dict.fromkeys(best, view))
    return Rows(views[0].schema, _python_rows(list(merged.islice(lo, hi, reverse=q.descending)), home))


def _merged_top(bests: list[list[bytes]], q: TopKQuery) -> tuple[SortedList, int, int]:
    """Each partition's best entries (``_best``) merged, and the positions [lo, hi) of the k
    best of all of them, cut as one index would be."""
    merged = SortedList(itertools.chain.from_iterable(bests))
    return (merged, *top(merged, q.k, q.descending, q.distinct))


def top_k_unchanged(views: list[ShardView], q: TopKQuery, since: list[int]) -> bool:
    """Whether ``top_k_together`` answers now what it answered when each partition was at its
    offset in ``since``: no write since reached the k-th best score now (the rows tied with it
    included), and the k best are k (with fewer, any write may join them)."""
    merged, lo, hi = _merged_top([_best(view, q) for view in views], q)
    held = len({score_of(e) for e in merged.islice(lo, hi)}) if q.distinct else hi - lo
    cut = score_of(merged[lo] if q.descending else merged[hi - 1]) if held else None  # the worst score held
    for view, offset in zip(views, since):
        if view.offset == offset:
            continue  # nothing written to it since
        touched = _index(view).touched_since(offset)
        if touched is None:
            return False
        low, high = touched
        if low is None:
            continue
        if cut is None or held < q.k or (score_of(high) >= cut if q.descending else score_of(low) <= cut):
            return False
    return True


def _python_rows(entries: list[bytes], home: Mapping[bytes, ShardView]) -> list[tuple]:
    """``_rows`` as Python values, for a together handler's few rows: entries of any
    partition, each read from the view it came from (``home``: the handler knows it, so no
    key is hashed again to find its partition)."""
    if not entries:
        return []
    defn = home[entries[0]].definition
    order, decode = key_order(defn.key_format), defn.row_decoder()
    rows = []
    for e in entries:
        k = order(e[8:])
        rows.append(decode(k, home[e].get(k)))
    return rows


def ranked_schema(defn: StoreDefinition, *names: str) -> pa.Schema:
    """The store's schema with int64 columns ``names`` after it (a rank, its anchor): one
    object per definition, as answers of every rank are checked against it."""
    return defn.derived(f"leaderboard:{','.join(names)}",
                        lambda d: pa.schema([*d.arrow_schema(), *(pa.field(n, pa.int64()) for n in names)]))


def sortable_score(defn: StoreDefinition, score: Any) -> int:
    """A score as the index orders it (a uint64)."""
    return score_of(sortable(defn.value_format, defn.value.coerce(score)))


def _with_tail(rows: pa.RecordBatch, extra: list[pa.Field], values: dict[str, list]) -> pa.RecordBatch:
    """``rows`` with the ``extra`` columns (null in them), then rows holding ``values`` in the
    extra columns and null in the store's: what a partition says beside its rows travels as rows
    (a call that answers several partitions carries one schema, so not as schema metadata)."""
    n = len(next(iter(values.values()), []))
    schema, nulls = _tail_layout(rows.schema, tuple(extra), n)
    tail = [*nulls, *(pa.array(values.get(f.name, [None] * n), f.type) for f in extra)]
    if not rows.num_rows:  # most partitions of a rank hold none of its players
        return pa.RecordBatch.from_arrays(tail, schema=schema)
    head = rows.columns + [pa.nulls(rows.num_rows, f.type) for f in extra]
    return pa.RecordBatch.from_arrays([pa.concat_arrays([h, t]) for h, t in zip(head, tail)], schema=schema)


@functools.lru_cache(maxsize=64)
def _tail_layout(schema: pa.Schema, extra: tuple[pa.Field, ...], n: int) -> tuple[pa.Schema, list[pa.Array]]:
    """The schema with the extra columns, and ``n`` nulls in each of the store's columns: the
    same for every partition a rank asks, so made once."""
    return pa.schema([*schema, *extra]), [pa.nulls(n, f.type) for f in schema]


def rank(view: ShardView, q: RankQuery) -> pa.RecordBatch:
    defn = view.definition
    key_bytes = key_order(defn.key_format)
    places = [(sortable_score(defn, s), key_bytes(defn.key.serialize(k)) if q.tie_key else b"")
              for s, k in zip(q.scores, q.keys or [None] * len(q.scores))]
    index = _index(view)
    with index.lock:
        values = _before(index.entries, places, Order(q.descending, q.tie_key), q.dense)
    rows = keys_query(view, KeysQuery(q.players)) if q.players else empty_batch(view.schema)
    return _with_tail(rows, RANK_FIELDS, values)


def places(view: ShardView, q: PlacesQuery) -> pa.RecordBatch:
    """PlacesQuery: the players' rows, then what ranks before each in this partition, and its size."""
    defn = view.definition
    rows = keys_query(view, KeysQuery(q.players)) if q.players else empty_batch(view.schema)
    key_bytes = key_order(defn.key_format)
    held = [(sortable_score(defn, s), key_bytes(defn.key.serialize(k)) if q.tie_key else b"")
            for k, s in zip(rows.column(defn.key_name).to_pylist(), rows.column(defn.value_columns[0]).to_pylist())]
    if not held:  # none of them here: nothing to say beside no rows
        return _with_tail(rows, PLACES_FIELDS, {})
    index = _index(view)
    with index.lock:
        values = _before(index.entries, held, Order(q.descending, q.tie_key), q.dense)
        values[ROWS] = [len(index.entries)]
    tail = max(map(len, values.values()))  # one list a column, each as long as the longest
    return _with_tail(rows, PLACES_FIELDS, {name: v + [None] * (tail - len(v)) for name, v in values.items()})


def _before(entries: SortedList, places: list[tuple[int, bytes]], order: Order, dense: bool) -> dict[str, list]:
    """What RankQuery and PlacesQuery say of ``places`` (sortable score, ordered key) beside
    their rows: how many entries rank before each (``__place``: its index, ``__count``), or
    with ``dense`` the distinct scores better than the worst place (``__score``)."""
    if dense:
        worst = (min if order.descending else max)((s for s, _ in places), default=None)
        return {SCORE: [] if worst is None else distinct_better(entries, worst, order.descending)}
    return {PLACE: list(range(len(places))), COUNT: [before(entries, s, k, order) for s, k in places]}


def scores(view: ShardView, q: ScoresQuery) -> pa.RecordBatch:
    """ScoresQuery: the partition's scores, ascending, or one null past ``q.most`` rows."""
    index = _index(view)
    with index.lock:
        packed = b"".join(map(_SCORE_BYTES, index.entries)) if len(index.entries) <= q.most else None
    column = pa.nulls(1, pa.uint64()) if packed is None else pa.array(np.frombuffer(packed, ">u8").astype(np.uint64))
    return pa.RecordBatch.from_arrays([column], schema=SCORES_SCHEMA)


def player_ranks(views: list[ShardView], q: PlayerRanksQuery) -> Rows:
    """The players' rows with their ranks over every partition (``views``: all of them)."""
    defn = views[0].definition
    order, key_bytes = Order(q.descending, q.tie_key), key_order(defn.key_format)
    keys, stored, places = [], [], []
    for player in dict.fromkeys(q.players):
        kb = defn.key.serialize(player)
        value = views[partition_for(kb, defn.partitions)].get(kb)
        if value is not None:
            keys.append(kb)
            stored.append(value)
            places.append((_stored_score(defn, value), key_bytes(kb)))
    index = together(list(map(_index, views)))
    if q.dense and q.tie_key is None:
        ranks = _dense_ranks(index, places, q.descending)
    else:
        ranked = _ranks(index, places, order)
        ranks = [ranked[p] for p in places]
    decode = defn.row_decoder()
    return Rows(ranked_schema(defn, RANK), [(*decode(k, v), r) for k, v, r in zip(keys, stored, ranks)])


def _ranks(index: TogetherIndex, places: Iterable[tuple[int, bytes]], order: Order) -> dict[tuple[int, bytes], int]:
    """Each place's rank over every partition: 1 + the rows that rank before it."""
    with index.lock:
        return {place: 1 + before(index.entries, *place, order) for place in places}


def _dense_ranks(index: TogetherIndex, places: list[tuple[int, bytes]], descending: bool) -> list[int]:
    """1 + the distinct scores, over all partitions, better than each place's: those better
    than the worst place, gathered once."""
    if not places:
        return []
    worst = (min if descending else max)(s for s, _ in places)
    with index.lock:
        ordered = sorted(distinct_better(index.entries, worst, descending))
    if descending:
        return [1 + len(ordered) - bisect.bisect_right(ordered, s) for s, _ in places]
    return [1 + bisect.bisect_left(ordered, s) for s, _ in places]


def _stored_score(defn: StoreDefinition, stored: bytes) -> int:
    """The sortable score (a uint64) of a stored row."""
    return score_of(sortable(defn.value_format, defn.value.deserialize(stored[8:])))


def around_rows(view: ShardView, q: AroundQuery) -> pa.RecordBatch:
    defn = view.definition
    score = int(q.score)
    picked, below, above = _entries(view, lambda entries: around(entries, score, q.above, q.below, q.descending),
                                    q.descending)
    stored = view.get(defn.key.serialize(q.player))
    now = None if stored is None else _stored_score(defn, stored)
    rows = _rows(view, picked).append_column(ENTRY, pa.array(picked, pa.binary()))
    ahead, behind = (above, below) if q.descending else (below, above)
    return _with_tail(rows, AROUND_FIELDS, {BEFORE: [ahead], AFTER: [behind], SCORE: [now]})


def ranks_around(views: list[ShardView], q: RanksAroundQuery) -> Rows:
    """The rows ranked around the player over every partition (``views``: all of them), each
    ranked exactly, from the rows near the player's place (``_near``)."""
    defn = views[0].definition
    order, key_bytes = Order(q.descending, q.tie_key), key_order(defn.key_format)
    kb = defn.key.serialize(q.player)
    stored = views[partition_for(kb, defn.partitions)].get(kb)
    if stored is None:
        return _ranked_rows(views, [], [], 0, {})
    index = together(list(map(_index, views)))

    def place(e: bytes) -> tuple[int, bytes]:  # what ranks an entry: its score, and its key where that breaks ties
        return score_of(e), e[8:] if q.tie_key else b""

    me = place(entry(_stored_score(defn, stored), key_bytes(kb)))
    with index.lock:
        near = _near(index.entries, me, max(q.above, 0), max(q.below, 0), order)
    home = {e: views[partition_for(key_bytes(e[8:]), defn.partitions)] for e in near}
    ranks = _ranks(index, [me, *map(place, near)], order)
    anchor = ranks[me]
    kept = sorted((ranks[place(e)], e) for e in near if anchor - q.above <= ranks[place(e)] <= anchor + q.below)
    return _ranked_rows(views, [e for _, e in kept], [r for r, _ in kept], anchor, home)


def _near(entries: SortedList, me: tuple[int, bytes], above: int, below: int, order: Order) -> list[bytes]:
    """The rows that rank from ``above`` places before the place ``me`` to ``below`` after it.
    Ties left tied rank a score group as one, so the window is of whole score groups
    (``around``); rows numbered with the key, the rows at the places around the player's."""
    if order.tie_key is None:
        lo, hi = around(entries, me[0], above, below, order.descending)
        return list(entries.islice(lo, hi))
    at = before(entries, *me, order)
    return [entries[nth(entries, k, order)] for k in range(max(at - above, 0), min(at + below + 1, len(entries)))]


def _ranked_rows(views: list[ShardView], entries: list[bytes], ranks: list[int], anchor: int,
                 home: Mapping[bytes, ShardView]) -> Rows:
    rows = _python_rows(entries, home)
    return Rows(ranked_schema(views[0].definition, RANK, ANCHOR), [(*row, r, anchor) for row, r in zip(rows, ranks)])


class LeaderboardStoreType(KeyValueStoreType):
    name = "leaderboard"
    column_families = (INDEX,)
    handlers = {**KeyValueStoreType.handlers, TopKQuery: top_k, RankQuery: rank, PlacesQuery: places, ScoresQuery: scores,
                AroundQuery: around_rows}
    together_handlers = {PlayerRanksQuery: player_ranks, TopKQuery: top_k_together, RanksAroundQuery: ranks_around}
    together_followers = {TopKQuery: top_k_unchanged}

    def validate(self, defn: StoreDefinition) -> None:
        if defn.value_format not in SCORE_FORMATS:
            raise DefinitionError(
                f"a leaderboard store keeps one numeric score per key: field 'value.format' must be one of "
                f"{', '.join(SCORE_FORMATS)}, got {defn.value_format!r}"
            )

    def memory(self, shard: ShardView) -> ScoreIndex:
        """The order-statistics index, read from the by_score column family."""
        order = key_order(shard.definition.key_format)
        return ScoreIndex((e[:8] + order(e[8:]) for e, _ in shard.scan(family=INDEX, fill_cache=False)), shard.offset)

    def apply(self, wb: WriteBatch, records: Iterable[ChangelogRecord], shard: ShardView) -> Callable[[], None]:
        defn = shard.definition
        fmt, value_fmt, index = defn.value_format, defn.value, shard.handle(INDEX)
        # each key's sortable score (None: no such key) before this batch, and as the batch has
        # written it so far: each score decoded once
        before_batch: dict[bytes, bytes | None] = {}
        latest: dict[bytes, bytes | None] = {}
        through = -1
        for r in records:
            through = r.offset
            if r.key in latest:
                old = latest[r.key]
            else:
                stored = shard.get(r.key)
                old = before_batch[r.key] = None if stored is None else sortable(fmt, value_fmt.deserialize(stored[8:]))
            if old is not None:
                wb.delete(old + r.key, index)
            if r.value is None:
                wb.delete(r.key)
                latest[r.key] = None
            else:
                wb.put(r.key, stored_value(r))
                new = latest[r.key] = sortable(fmt, value_fmt.deserialize(r.value))
                wb.put(new + r.key, b"", index)
        order = key_order(defn.key_format)
        removed = [score + order(k) for k, score in before_batch.items() if score is not None]
        added = [score + order(k) for k, score in latest.items() if score is not None]
        return shard.memory.change(removed, added, through)
