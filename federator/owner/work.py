"""The SQL an owner runs over its partitions' rows, as the planner sent it."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from federator.errors import SqlError
from federator.owner.duck import Duck
from federator.owner.maintained import Maintained, maintained
from federator.query.result import FailureReason, QueryResult
from federator.store.scan_cache import ScanCache

ROWS = "rows"  # the relation an owner's SQL reads: its partitions' rows


def owners_sql(duck: Duck, sql: str, parts: list[tuple[QueryResult, Any]], cache: ScanCache | None = None) -> None:
    """The SQL that runs where the rows are (a filter, a top-k, a partial aggregate), in one
    DuckDB statement over all of this node's partitions of the request: each of those is as
    valid over a union of partitions as over one (the receiver filters, ranks or combines
    again), and one statement's fixed cost replaces one per partition. Kept beside the
    scans it read in ``cache`` (the node's scan cache; each part's shard is the one it keys
    that shard's scan by, ``StoreLayer.base``); a kept count or sum follows the rows written
    since (federator.owner.maintained). The answer rides on the first partition."""
    scans = [(shard, r.batch) for r, shard in parts]
    follow = maintained(sql) if cache is not None else None
    work = follow.sql if follow is not None else sql
    batch = cache.derived(scans, work) if cache is not None else None
    if batch is None:
        try:
            batch, followed = _compute(duck, work, follow, scans, cache)
        except SqlError as e:  # the data or the SQL failed: the receiver reports it as the user's error
            for r, _ in parts:
                r.batch, r.failure, r.message, r.code = None, FailureReason.STORE_EXCEPTION, e.message, e.code
            return
        if cache is not None:
            cache.put_derived(scans, work, batch, maintained=followed)
    if follow is not None:
        batch = follow.visible_part(batch)
    empty = batch.slice(0, 0)
    for i, (r, _) in enumerate(parts):
        r.batch = batch if i == 0 else empty


def _compute(duck: Duck, work: str, follow: Maintained | None, scans: list[tuple[Any, pa.RecordBatch]],
             cache: ScanCache | None) -> tuple[pa.RecordBatch, bool]:
    """``work``'s result over the scans, and whether it came from a kept one and the rows
    changed since."""
    if follow is not None and cache is not None:
        since = cache.derived_since(scans, work)
        if since is not None:
            result = follow.follow(since.result, since.added, since.removed)
            if result is not None:
                return result, True
    return duck.over_rows(work, pa.Table.from_batches([b for _, b in scans])), False
