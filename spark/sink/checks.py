"""The checks before anything is written (driver side): the store against the catalog, and
pass 1 over every row, in Spark alone (no Python worker). Each check is a row condition (null
keys, NaN in JSON doubles, ...); each row gets a 64-bit hash of its changelog key, null where a
check fails; only the hashes come back, sorted on the driver to find duplicates (or grouped by
Spark for very large writes), with an exact group-by only when two hashes match, and a job of
its own to count each check only when some row failed."""

from __future__ import annotations

import functools
import logging
from dataclasses import replace
from typing import Any, Sequence

from federator import kafka
from federator.catalog import Catalog, StoreDefinition
from federator_spark.sink.errors import SinkError
from federator_spark.sink.plan import Plan

log = logging.getLogger(__name__)

# Up to this many rows (as Spark's plan statistics estimate them) the duplicate check sorts the
# 8-byte key hashes on the driver (8 MB per million rows); above it, or without an estimate, a
# Spark group-by on the hashes keeps the driver's memory flat.
DRIVER_HASH_ROWS = 4_000_000


def check_store(catalog: Catalog, defn: StoreDefinition) -> tuple[StoreDefinition, bool]:
    """The definition to write under (the catalog's topic if it names another), and whether
    the store exists already. Raises SinkError when the existing store differs."""
    try:
        existing = catalog.load().get(defn.name)
    except kafka.KafkaUnavailable as e:
        raise kafka.KafkaUnavailable(f"cannot read the catalog: {e}") from None
    if existing is None:
        adm = kafka.admin(catalog.bootstrap_servers)
        have = kafka.topic_partitions(adm, defn.topic)
        if have is not None and have != defn.partitions:
            raise SinkError(
                f"topic {defn.topic!r} exists with {have} partitions, not {defn.partitions}; "
                f"pass partitions={have} or delete the topic"
            )
        return defn, False
    if existing.topic != defn.topic:
        defn = replace(defn, topic=existing.topic, types=catalog.types)
    if existing.partitions != defn.partitions:
        raise SinkError(
            f"store {defn.name!r} exists with {existing.partitions} partitions, not {defn.partitions}; "
            f"pass partitions={existing.partitions} (a store's partition count cannot change)"
        )
    if existing != defn:
        diffs = "; ".join(existing.differences(defn))
        raise SinkError(
            f"store {defn.name!r} exists with another definition (existing vs this DataFrame: {diffs}); "
            "write the same columns with the same Spark types, or use another store name"
        )
    return defn, True


def key_hash(columns: Sequence[str]) -> Any:
    """A 64-bit hash of what identifies a changelog key (computed by Spark, next to the data)."""
    from pyspark.sql import functions as F

    return F.xxhash64(*[F.col(c) for c in columns])


def failing(plan: Plan) -> Any:
    """A row condition: the row fails some check (pass 2 reads it as its guard against rows
    that changed since pass 1)."""
    from pyspark.sql import functions as F

    return functools.reduce(lambda a, b: a | b, [F.coalesce(cond, F.lit(False)) for _, cond in plan.checks])


def hash_unless_failing(plan: Plan, fails: Any) -> Any:
    """Pass 1's one column ``h``: the key hash, null where any check fails (the error path can
    afford a job of its own to count each check)."""
    from pyspark.sql import functions as F

    return F.when(fails, F.lit(None)).otherwise(key_hash(plan.unique_by)).alias("h")


def estimated_rows(df: Any) -> int | None:
    """Spark's estimate of ``df``'s row count: exact for ranges and local data, else its size
    estimate over 8 bytes (for files that is their compressed size, so it may be off a few
    times either way: the driver path holds 8 bytes per row)."""
    rows, size = estimate(df)
    return rows if rows is not None else size // 8 if size is not None else None


def estimate(df: Any) -> tuple[int | None, int | None]:
    """Spark's plan statistics for ``df``: (row count if known, size in bytes), or Nones."""
    try:
        stats = df._jdf.queryExecution().optimizedPlan().stats()
        count = stats.rowCount()
        # str(): py4j hands Scala BigInts over as Python ints (which have no toString)
        return (int(str(count.get())) if count.isDefined() else None), int(str(stats.sizeInBytes()))
    except Exception:  # an internal API: without it, take the path that fits any size
        log.debug("no estimate of the rows", exc_info=True)
        return None, None


def costly(df: Any) -> bool:
    """Whether computing ``df`` a second time (pass 2) costs a shuffle, or could give other rows
    than pass 1 checked: then the rows are cached between the passes."""
    try:
        qe = df._jdf.queryExecution()
        return not qe.optimizedPlan().deterministic() or "Exchange" in qe.executedPlan().toString()
    except Exception:  # an internal API: without it, caching is the safe side
        log.debug("cannot inspect the plan; caching the rows between the passes", exc_info=True)
        return True


def check_rows(hashes: Any) -> tuple[int, int, bool]:
    """Pass 1, in Spark alone (no Python worker): over ``hashes`` (one column ``h``, null where
    a row fails some check), the rows, how many fail and whether two rows share a key hash
    (every duplicate does; a hash collision may too)."""
    from pyspark.sql import functions as F

    estimate = estimated_rows(hashes)
    if estimate is not None and estimate <= DRIVER_HASH_ROWS:
        return hash_summary(hashes.toArrow().column("h"))
    n = F.col("n")
    per_hash = hashes.groupBy("h").agg(F.count(F.lit(1)).alias("n"))
    r = per_hash.agg(F.sum(n).alias("total"), F.sum(F.when(F.col("h").isNull(), n)).alias("failed"),
                     F.max(F.when(F.col("h").isNotNull(), n)).alias("most")).first()
    return int(r["total"] or 0), int(r["failed"] or 0), bool((r["most"] or 0) > 1)


def hash_summary(h: Any) -> tuple[int, int, bool]:
    """check_rows's answer from the key hashes (an Arrow column) on the driver."""
    import numpy as np

    failed = h.null_count
    if failed:
        return len(h), failed, False
    arr = np.sort(h.to_numpy())
    return len(arr), 0, bool(len(arr) > 1 and (arr[1:] == arr[:-1]).any())


def raise_check_failures(rows: Any, plan: Plan, store: str) -> None:
    """Count each check's failures (a job of its own: only when some row failed) and raise
    the first check that failed."""
    from pyspark.sql import functions as F

    counts = rows.agg(*[F.count(F.when(cond, 1)).alias(f"c{i}") for i, (_, cond) in enumerate(plan.checks)]).first()
    for i, (msg, _) in enumerate(plan.checks):
        if counts[f"c{i}"]:
            raise SinkError(f"{msg.format(n=counts[f'c{i}'])} (store {store!r}; nothing was written)")
    raise RuntimeError(f"pass 1 saw rows failing a check, but counting found none (store {store!r}; "
                       "nothing was written): is the DataFrame non-deterministic?")


def raise_duplicates(rows: Any, plan: Plan, store: str) -> None:
    """The exact duplicate check (a group-by on the changelog key): raise naming the keys."""
    from pyspark.sql import functions as F

    dupes = rows.groupBy(*plan.unique_by).agg(F.count(F.lit(1)).alias("n")).where(F.col("n") > 1)
    examples = dupes.orderBy(F.col("n").desc()).limit(3).collect()
    if not examples:
        return
    shown = ", ".join(f"{tuple(r[c] for c in plan.unique_by) if len(plan.unique_by) > 1 else r['k']!r}"
                      f" x{r['n']}" for r in examples)
    raise SinkError(
        f"{plan.key_label} is not unique ({dupes.count()} keys appear more than once: {shown}); "
        f"a store holds one value per key, so aggregate the DataFrame to one row per key first "
        f"(store {store!r}; nothing was written)"
    )
