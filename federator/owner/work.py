"""The SQL an owner runs over its partitions' rows, as the planner sent it."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from federator.errors import SqlError
from federator.owner.duck import Duck
from federator.owner.maintained import maintained
from federator.query.result import FailureReason, QueryResult
from federator.query.position import PositionBound
from federator.store.layer import StoreLayer
from federator.store.scan_cache import ScanCache, Since

ROWS = "rows"  # the relation an owner's SQL reads: its partitions' rows


def owners_sql(duck: Duck, sql: str, parts: list[tuple[QueryResult, Any]], cache: ScanCache | None = None) -> None:
    """The SQL that runs where the rows are (a filter, a top-k, a partial aggregate), in one
    DuckDB statement over all of this node's partitions of the request: each of those is as
    valid over a union of partitions as over one (the receiver filters, ranks or combines
    again), and one statement's fixed cost replaces one per partition. Kept beside the
    scans it read in ``cache`` (the node's scan cache; each part's shard is the one it keys
    that shard's scan by, ``StoreLayer.base``). A followable statement (federator.owner.maintained)
    is computed with its hidden counts, for followed_answer to follow later writes from. The
    answer rides on the first partition."""
    scans = [(shard, r.batch) for r, shard in parts]
    follow = maintained(sql) if cache is not None else None
    work = follow.sql if follow is not None else sql
    batch = cache.derived(scans, work) if cache is not None else None
    if batch is None:
        try:
            batch = duck.over_rows(work, pa.Table.from_batches([b for _, b in scans]))
        except SqlError as e:  # the data or the SQL failed: the receiver reports it as the user's error
            for r, _ in parts:
                r.batch, r.failure, r.message, r.code = None, FailureReason.STORE_EXCEPTION, e.message, e.code
            return
        if cache is not None:
            cache.put_derived(scans, work, batch)
    if follow is not None:
        batch = follow.visible_part(batch)
    empty = batch.slice(0, 0)
    for i, (r, _) in enumerate(parts):
        r.batch = batch if i == 0 else empty


def followed_answer(sql: str, stores: list[tuple[int, StoreLayer]], bound: PositionBound,
                    cache: ScanCache | None) -> list[QueryResult] | None:
    """``sql`` over these partitions (each: the partition, its store) from the result kept at
    earlier write sequences and the rows written since, neither reading the scans nor bringing
    them up to date: a count or a sum right after a write costs what the write changed. Each
    partition's position is the one its changed rows were read at. None when that cannot be
    told (nothing kept, writes not held, not a followable statement): the caller reads the scans."""
    follow = maintained(sql) if cache is not None else None
    if follow is None or cache is None:
        return None
    owners = [store.base for _, store in stores]
    kept = cache.kept_result(follow.sql, owners)
    if kept is None:
        return None
    seqs, result = kept
    changes, positions, now = [], [], []
    for seq, (_, store) in zip(seqs, stores):
        got = store.changes_since(seq, bound)
        if got is None:
            return None
        changes.append(got[0])
        positions.append(got[1])
        now.append(got[2])
    if tuple(now) != seqs:
        since = Since.of(result, changes)
        result = follow.follow(result, since.added, since.removed)
        if result is None:
            return None
        cache.put_derived_at(owners, follow.sql, tuple(now), result)
    batch = follow.visible_part(result)
    empty = batch.slice(0, 0)
    return [QueryResult.success(p, batch if i == 0 else empty, position)
            for i, ((p, _), position) in enumerate(zip(stores, positions))]
