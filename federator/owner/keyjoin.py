"""A co-partitioned join on the keys, done by the owner as a lookup in Arrow.

Partition p of two co-partitioned kv stores holds exactly the keys that hash to p, and a kv
shard holds a key once. An equality join of the two keys therefore pairs a row with at most
one row of the other side: a lookup, as in a KTable-KTable join, not a general join. DuckDB's
hash join does not know that, and costs as much on the owner as at the receiver. Per
partition, here:

- when both sides hold the same keys in the same order, row i pairs with row i and the joined
  rows are the two sides' columns side by side, without a copy. Full scans come out of
  RocksDB in key order, so two stores over the same keys (two tables of one entity) take this
  path for the cost of comparing the two key columns;
- when one side has a few keys (its own filter cut it down) and the other is a scan in key
  order, each of the few is found by binary search, reading some 20 of the other's keys;
- otherwise a hash table of the smaller side's keys (Arrow's ``index_in``) is probed with the
  other side's. Building it costs about ten times more per key than probing it: this pays
  only when one side is much smaller (pays()); a partition where it does not is joined by
  DuckDB's hash join, in the same statement as the owner's SQL over the looked-up rows.

Each side's own filters (the WHERE conjuncts over its columns alone that the join lets run
first) are applied before the lookup, as DuckDB would push them into its scans, and kept
beside a kept scan as any owner's filter over one store is; the owner's remaining SQL
(filter, top-k, partial aggregate) then runs in DuckDB over the joined rows, named
``"<alias>.<column>"`` as ``federator.sql.copartition`` names them.

Only key formats whose values are equal exactly when their stored bytes are (string, bytes,
long, int; not double, where -0.0 = 0.0), so that Arrow's equality is DuckDB's; NULL keys never
match. Anything else keeps the DuckDB join.
"""

from __future__ import annotations

from concurrent.futures import Executor
from typing import Hashable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from federator.owner.duck import Duck, one_batch
from federator.owner.work import ROWS
from federator.query.owner_work import KeyJoin, Side
from federator.store.arrow import search_sorted as _search  # module-level: tests count its calls
from federator.store.scan_cache import ScanCache

KEY_FORMATS = ("string", "bytes", "long", "int")  # stored bytes equal <=> values equal
LOOKUP_RATIO = 4  # see pays()
SEARCH_RATIO = 2048  # see _few(): a search reads ~17 keys at ~3 us each in Python, probing a hash ~20 ns a key
LEFT, RIGHT = "__left", "__right"  # the two sides' rows in DuckDB's join, where it is DuckDB's
JOINED = "__joined"  # the rows joined by lookups, beside DuckDB's join of the other partitions
SIDE_KEY = "key join side: "  # what a side's filtered rows are kept under beside its scan


def same_keys(left: pa.Array, right: pa.Array) -> bool:
    """Whether row i of each side holds the same key, for every i (NULL is no key)."""
    return left.null_count == 0 and right.null_count == 0 and left.equals(right)


def pays(left: int, right: int) -> bool:
    """Whether a lookup beats DuckDB's hash join over sides of these sizes when their keys
    differ: one side at most 1/LOOKUP_RATIO of the other. Probing Arrow's hash table costs
    about a tenth of building it; measured over 1M+1M string keys in 8 partitions, the lookup
    took more CPU than DuckDB's join when one side was half the other, less at a quarter."""
    return min(left, right) * LOOKUP_RATIO <= max(left, right)


def pairs(left: pa.Array, right: pa.Array, in_order: tuple[bool, bool] = (False, False)
          ) -> tuple[np.ndarray, np.ndarray]:
    """The rows of the two sides that hold the same key, as (left rows, right rows). Each side
    holds a key at most once; ``in_order``: whether each side's keys are in key order, as a
    scan returns them."""
    if len(right) <= len(left):  # the right side's keys are the fewer
        if in_order[0] and _few(right, left):
            right_rows, left_rows = _hits(_search(right, left))  # each searched among the left's
        else:  # a hash table of them, probed with the left's
            left_rows, right_rows = _hits(pc.index_in(left, value_set=right, skip_nulls=True))
    elif in_order[1] and _few(left, right):
        left_rows, right_rows = _hits(_search(left, right))
    else:
        right_rows, left_rows = _hits(pc.index_in(right, value_set=left, skip_nulls=True))
    return left_rows, right_rows


def _hits(found: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """``found`` (for each row of one side, the other side's row holding its key; null: none,
    as index_in gives it: skip_nulls, so a NULL key matches nothing) as (rows, their rows)."""
    hit = found.is_valid()
    return np.flatnonzero(hit.to_numpy(zero_copy_only=False)), found.filter(hit).to_numpy()


def _few(needles: pa.Array, ordered: pa.Array) -> bool:
    """Whether binary searches for ``needles`` in ``ordered`` (a few Python steps each) cost less
    than hashing every key of ``ordered`` to probe a hash table of them."""
    return len(needles) * SEARCH_RATIO <= len(ordered) and ordered.null_count == 0


def join(left: pa.RecordBatch, right: pa.RecordBatch, spec: KeyJoin,
         in_order: tuple[bool, bool] = (False, False)) -> pa.RecordBatch:
    """The joined rows of one partition's two sides (each with its key and columns)."""
    lk, rk = left.column(spec.left.key), right.column(spec.right.key)
    return _joined(left, right, spec, None if same_keys(lk, rk) else pairs(lk, rk, in_order))


def _joined(left: pa.RecordBatch, right: pa.RecordBatch, spec: KeyJoin,
            found: tuple[np.ndarray, np.ndarray] | None) -> pa.RecordBatch:
    """The joined rows, given the rows that pair up (None: row i of each side, for every i)."""
    if found is not None and spec.keep_unmatched:
        at = np.full(len(left), -1, np.int64)
        at[found[0]] = found[1]
        right = right.take(pa.array(at, mask=at < 0))  # a null index takes a row of NULLs
    elif found is not None:
        left, right = left.take(found[0]), right.take(found[1])
    arrays = [left.column(c) for c, _ in spec.left.columns] + [right.column(c) for c, _ in spec.right.columns]
    return pa.RecordBatch.from_arrays(arrays, names=[n for _, n in spec.left.columns + spec.right.columns])


def side_rows(side: Side, rows: pa.RecordBatch, duck: Duck, owner: Hashable | None = None,
              cache: ScanCache | None = None) -> pa.RecordBatch:
    """One side's key and columns, its own filter applied. Over a shard's kept scan (``owner``
    the shard, ``cache`` the node's scan cache) the filtered rows are kept beside it, as any
    owner's filter over one store is."""
    names = side.reads
    if side.filter is None:
        return rows.select(names)
    cache_key = SIDE_KEY + side.filter
    if cache is None:
        owner = None
    kept = cache.derived([(owner, rows)], cache_key) if owner is not None and cache is not None else None
    if kept is None:
        kept = duck.over_rows(side.filter, rows)
        # back to the store's types (DuckDB gives timestamps in microseconds): both partitions'
        # joined rows, filtered or not, must have one schema
        wanted = pa.schema([rows.schema.field(n) for n in names])
        if not kept.schema.equals(wanted):
            kept = kept.cast(wanted)
        if owner is not None and cache is not None:
            cache.put_derived([(owner, rows)], cache_key, kept)
    return kept


Part = tuple[pa.RecordBatch, pa.RecordBatch, Hashable | None, Hashable | None]


def _kept_sides(spec: KeyJoin, part: Part, cache: ScanCache | None) -> bool:
    """Whether each filtered side's rows are kept beside its scan (side_rows will look them up)."""
    for side, rows, owner in ((spec.left, part[0], part[2]), (spec.right, part[1], part[3])):
        if side.filter is not None and (cache is None or owner is None or
                                        cache.derived([(owner, rows)], SIDE_KEY + side.filter) is None):
            return False
    return True


def _how(spec: KeyJoin, pair: tuple[pa.RecordBatch, pa.RecordBatch], in_order: tuple[bool, bool]) -> str:
    """How a partition's sides are joined: "same" keys row by row, "duckdb" (a lookup does not
    pay), a binary "search" of the few keys, or a "hash" probe (Arrow's work, worth a thread)."""
    lk, rk = pair[0].column(spec.left.key), pair[1].column(spec.right.key)
    if same_keys(lk, rk):
        return "same"
    if not pays(len(lk), len(rk)):
        return "duckdb"
    few = in_order[0] and _few(rk, lk) if len(rk) <= len(lk) else in_order[1] and _few(lk, rk)
    return "search" if few else "hash"


def run(spec: KeyJoin, duck: Duck, parts: list[Part], pool: Executor | None = None,
        in_key_order: bool = False, cache: ScanCache | None = None) -> pa.RecordBatch:
    """The owner's answer over its partitions, each given as (left rows, right rows, left
    shard, right shard): both sides filtered, then each partition joined as a lookup where
    its pair pays() for it, the others by DuckDB's join, then the owner's SQL once over all
    the joined rows. A key lives in one partition of each store, so the pairs of all
    partitions at once are the pairs partition by partition. The per-partition filters and
    hash probes run on ``pool``'s threads when given: Arrow and DuckDB release the GIL.
    ``in_key_order``: the rows given are in key order (a RangeQuery's), so an unfiltered side
    may be searched.
    ``cache``: the node's scan cache, where a side's filtered rows are kept beside its scan."""
    in_order = (in_key_order and spec.left.filter is None, in_key_order and spec.right.filter is None)
    threads = pool if pool is not None and len(parts) > 1 else None

    def sides(part: Part) -> tuple[pa.RecordBatch, pa.RecordBatch]:
        return (side_rows(spec.left, part[0], duck, part[2], cache), side_rows(spec.right, part[1], duck, part[3], cache))

    # Threads pay where Arrow or DuckDB do the work (a side's filter, a hash probe), not for a
    # filter kept beside its scan or a few binary searches, which hold the GIL and would
    # only add hand-offs (a selective join over 1M+1M rows was slower on threads).
    if threads is not None and not all(_kept_sides(spec, part, cache) for part in parts):
        both = list(threads.map(sides, parts))
    else:
        both = [sides(part) for part in parts]

    def one(pair: tuple[pa.RecordBatch, pa.RecordBatch], how: str) -> pa.RecordBatch | tuple[pa.RecordBatch, pa.RecordBatch]:
        """A partition's joined rows, or its two sides where DuckDB's join costs less."""
        left, right = pair
        if how == "same":
            return _joined(left, right, spec, None)
        if how == "duckdb":
            return left, right
        return _joined(left, right, spec, pairs(left.column(spec.left.key), right.column(spec.right.key), in_order))

    hows = [_how(spec, pair, in_order) for pair in both]
    hashed = [i for i, how in enumerate(hows) if how == "hash"]
    done: list[pa.RecordBatch | tuple[pa.RecordBatch, pa.RecordBatch]] = [None] * len(both)
    if threads is not None and len(hashed) > 1:
        for i, d in zip(hashed, threads.map(lambda i: one(both[i], "hash"), hashed)):
            done[i] = d
    for i, pair in enumerate(both):
        if done[i] is None:
            done[i] = one(pair, hows[i])
    looked_up = [d for d in done if isinstance(d, pa.RecordBatch)]
    rest = [d for d in done if not isinstance(d, pa.RecordBatch)]
    if not rest:
        table = pa.Table.from_batches(looked_up)
        if spec.columns is not None:
            return one_batch(table.select(list(spec.columns)))
        return duck.over(spec.sql, {ROWS: table})
    relations = {LEFT: pa.Table.from_batches([left for left, _ in rest]),
                 RIGHT: pa.Table.from_batches([right for _, right in rest])}
    if not looked_up:
        return duck.over(f"WITH {ROWS} AS ({spec.join_sql}) {spec.sql}", relations)
    relations[JOINED] = pa.Table.from_batches(looked_up)
    return duck.over(f"WITH {ROWS} AS (SELECT * FROM {JOINED} UNION ALL {spec.join_sql}) {spec.sql}", relations)
