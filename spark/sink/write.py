"""The public write (``write_store``) and delete (``delete_keys``), on the driver: plan, check
(pass 1), register, produce (pass 2), delete what replace mode leaves behind, and return the
consistency token. The rows are computed by both passes; they are cached in between only when
computing them costs a shuffle or may give other rows (a non-deterministic plan). A write of
few rows is produced by the driver, without Python tasks (spark/sink/small.py). Nothing is
written before pass 1 has passed."""

from __future__ import annotations

import functools
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

import pyarrow as pa

from federator import kafka
from federator.catalog import Catalog, CatalogConflict, changelog_topic
from federator.plugin import Registry, load_plugins
from federator.query.position import Position
from federator.store.layout import changelog_keys
from federator_spark.sink.checks import (check_rows, check_store, costly, estimate, failing, hash_summary,
                               hash_unless_failing, raise_check_failures, raise_duplicates)
from federator_spark.sink.deletes import live_keys, tombstones, unmarked
from federator_spark.sink.encoding import encode
from federator_spark.sink.errors import SinkError
from federator_spark.sink.plan import SIMPLE_FORMAT_OF, field, plan, time_column, type_name
from federator_spark.sink.producing import (RESULT_DDL, WriteSpec, drop_driver_producer, driver_producer,
                                  producer_config, write_partition)
from federator_spark.sink.small import Held, fetch_small, fits, produce_small, with_bad
from federator_spark.sink.tasks import PASS2_ARROW_CONF, SPARK_FAILURES, map_in_arrow, session_conf, worker_failure

log = logging.getLogger(__name__)

MODES = ("upsert", "replace")


def write_store(
    df: Any,
    store: str,
    *,
    key: str,
    value: str | Sequence[str] | None = None,
    type: str = "kv",
    partitions: int = 8,
    bootstrap_servers: str,
    application_id: str,
    window_start: str | None = None,
    window_size_ms: int | None = None,
    session_start: str | None = None,
    session_end: str | None = None,
    mode: str = "upsert",
    progress: Callable[[str], None] | None = None,
    timeout: float = 120.0,
    registry: Registry | None = None,
    kafka_config: str | None = None,
    global_store: bool = False,
) -> str:
    """Write ``df`` into the store ``store`` and return a consistency token.

    - ``key``: the key column; its Spark type picks the format (string, long, int, double, binary).
    - ``value``: one column (a simple format from its type), a list of columns (a JSON record
      whose fields are string/long/int/double/boolean/timestamp), or None for every column
      that is not the key or a window/session time.
    - ``type="window"``: ``window_start`` (timestamp or epoch-ms long column) and
      ``window_size_ms``; ``type="session"``: ``session_start`` and ``session_end`` columns.
    - ``mode="replace"``: keys in the store but not in ``df`` are deleted with tombstones.
    - ``global_store=True``: a global store (every node keeps all its partitions and answers
      it without calling another node; a join with it runs on the other store's owners).

    The store is registered in the catalog (its topic created) unless it exists with the same
    definition; anything else raises SinkError before a single record is written. A re-run
    with the same DataFrame leaves the same store. ``progress`` gets one line per step.
    ``registry``: the store types and formats to write by (``federator.plugin.load_plugins()``;
    by default one is loaded for this call). ``kafka_config``: a file of the cluster's Kafka client
    properties (security.protocol, sasl.*, ssl.ca.location, ...) as `federator --kafka-config`
    takes; default: those this process was given for ``bootstrap_servers``, else the file
    $FEDERATOR_KAFKA_CONFIG names.
    """
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    say = progress or (lambda msg: log.info("%s", msg))
    if mode not in MODES:
        raise SinkError(f"mode={mode!r}: use 'upsert' (add and overwrite keys) or 'replace' (also delete missing keys)")
    if not bootstrap_servers or not application_id:
        raise SinkError("pass bootstrap_servers='HOST:PORT' and application_id='APP' (the nodes' application id)")
    registry = registry or load_plugins()
    config = producer_config(bootstrap_servers, kafka_config)  # before the driver's first Kafka client
    the_plan = plan(
        df, store, key=key, value=value, type=type, partitions=partitions,
        topic=changelog_topic(application_id, store) if isinstance(store, str) else "?",
        window_start=window_start, window_size_ms=window_size_ms,
        session_start=session_start, session_end=session_end, registry=registry, global_store=global_store,
    )
    catalog = Catalog(bootstrap_servers, application_id, registry)
    # While Spark runs pass 1: read the catalog, and have the driver's producer (catalog record,
    # tombstones) fetch its producer id. Neither writes anything; a definition that does not
    # fit still fails first.
    pool = ThreadPoolExecutor(1)
    store_check = pool.submit(check_store, catalog, the_plan.defn)
    warm = pool.submit(driver_producer, bootstrap_servers)
    pool.shutdown(wait=False)

    started = time.monotonic()
    now_ms = int(time.time() * 1000)  # kv records' time: the write's start
    rows = df.select(*the_plan.projection, *the_plan.extra)
    write_columns = [c for c in ("k", "v", "t1", "t2") if c in rows.columns]
    # Pass 1 reads one column: the key hash, null where any check fails. Pass 2 reads the rows
    # and whether each fails a check (its guard against rows that changed since pass 1), not
    # the hash again.
    fails = failing(the_plan)
    key_hash = hash_unless_failing(the_plan, fails)
    guess = estimate(rows)  # Spark's statistics: whether the driver may write the rows (small.py)
    staged = None
    try:
        # ---- pass 1: every check, in Spark; only the key hashes come back ----------------
        # (few rows may come back whole, to be written from the driver: spark/sink/small.py)
        try:
            with_hash = rows.select(*write_columns, key_hash)
            fetched = fetch_small(with_hash, guess)
            if fetched is not None:
                total, failed, maybe_duplicates = hash_summary(fetched.column("h"))
            else:
                # Pass 2 computes the rows again unless that costs a shuffle or may give other
                # rows (non-deterministic): then Spark caches them, so both passes see the same rows.
                if costly(rows):
                    staged = with_hash.persist(StorageLevel.MEMORY_AND_DISK)
                    hashes = staged.select("h")
                    to_write = staged.select(*write_columns, F.col("h").isNull().alias("bad"))
                else:  # one DataFrame (one plan to analyze) fewer
                    hashes = rows.select(key_hash)
                    to_write = rows.select(*write_columns, fails.alias("bad"))
                total, failed, maybe_duplicates = check_rows(hashes)
        except Exception as e:  # a task failed: say why in one line
            store_check.result()
            if e.__class__.__name__ in SPARK_FAILURES:
                raise RuntimeError(f"checking store {store!r} failed (nothing was written): "
                                   f"{worker_failure(e)}") from e
            raise
        defn, exists = store_check.result()
        if failed:
            raise_check_failures(rows, the_plan, store)
        if maybe_duplicates:
            raise_duplicates(rows, the_plan, store)  # a hash collision passes: the exact check finds none
        say(f"{store}: {total} rows checked ({time.monotonic() - started:.1f}s)")

        # ---- register, then write -------------------------------------------------------
        producer = warm.result()
        try:
            catalog.register(defn, producer=producer)
        except CatalogConflict as e:  # another writer registered it meanwhile
            raise SinkError(str(e)) from None
        except BaseException:
            drop_driver_producer(bootstrap_servers, producer)
            raise
        if not exists:
            say(f"{store}: registered in {catalog.topic} "
                f"({defn.type}, {defn.partitions} partitions, topic {defn.topic})")
        existing = None
        if mode == "replace" and exists:
            existing = live_keys(bootstrap_servers, defn.topic, defn.partitions, timeout)
            say(f"{store}: {len(existing)} keys in the changelog before the write")
        spark = df.sparkSession
        existing_keys = sorted(existing) if existing else []
        on_driver = fetched is not None or fits(total, guess)
        index = {k: i for i, k in enumerate(existing_keys)}
        bc = None if not existing_keys else Held(index) if on_driver else spark.sparkContext.broadcast(index)
        spec = WriteSpec(
            bootstrap_servers=bootstrap_servers, topic=defn.topic, partitions=defn.partitions,
            layout=defn.store_type.changelog_layout, key=defn.key,
            value=None if the_plan.value_encoded else defn.value,
            now_ms=now_ms, producer_config=config, flush_timeout=timeout, existing=bc,
        )
        # ---- pass 2: serialize and produce, one Python pass over the rows ----------------
        write_started = time.monotonic()
        try:
            if on_driver:
                results = produce_small(spec, with_bad(fetched) if fetched is not None else to_write.toArrow())
            else:
                writer = functools.partial(write_partition, spec)
                with session_conf(spark, PASS2_ARROW_CONF):
                    results = map_in_arrow(to_write, writer, RESULT_DDL).collect()
        except Exception as e:  # a task failed: say why in one line
            if e.__class__.__name__ in SPARK_FAILURES:
                raise kafka.KafkaUnavailable(f"writing store {store!r} failed: {worker_failure(e)}") from e
            if on_driver and isinstance(e, RuntimeError):  # as a task's failure would say it
                raise kafka.KafkaUnavailable(f"writing store {store!r} failed: {e}") from e
            raise
        finally:
            if bc is not None and not isinstance(bc, Held):
                bc.unpersist()
        offsets: dict[int, int] = {}
        written = 0
        seen = 0  # bitmap over existing_keys: written by some task
        for r in results:
            if r["partition"] < 0:
                seen |= int.from_bytes(r["seen"], "little")
                continue
            offsets[r["partition"]] = max(offsets.get(r["partition"], -1), r["offset"])
            written += r["records"]
        took = time.monotonic() - write_started
        say(f"{store}: wrote {written} records to {defn.topic} in {took:.1f}s"
            + (f" ({written / took:,.0f} records/s)" if took > 0 and written else ""))
        if existing_keys:
            gone = unmarked(existing_keys, seen)
            if gone:
                for p, o in tombstones(bootstrap_servers, defn, gone, now_ms, timeout).items():
                    offsets[p] = max(offsets.get(p, -1), o)
            say(f"{store}: deleted {len(gone)} keys that are no longer in the DataFrame")
    finally:
        if staged is not None:
            staged.unpersist()
    return Position({defn.topic: offsets}).to_token()


def delete_keys(
    df: Any,
    store: str,
    *,
    key: str,
    bootstrap_servers: str,
    application_id: str,
    window_start: str | None = None,
    session_start: str | None = None,
    session_end: str | None = None,
    timeout: float = 120.0,
    registry: Registry | None = None,
) -> str:
    """Delete (tombstone) the entries that ``df``'s rows name in the existing store ``store``
    and return a consistency token; a store that does not exist has nothing to delete.

    A row names an entry by its key column, plus ``window_start`` for a window store or
    ``session_start`` and ``session_end`` for a session store (as in ``write_store``). The rows
    are collected to the driver: this is for a few entries at a time, e.g. the sessions that a
    streaming micro-batch merged into longer ones, where ``mode="replace"`` cannot serve (it
    needs the whole store's contents in one DataFrame).
    """
    from pyspark.sql import functions as F

    defn = Catalog(bootstrap_servers, application_id, registry or load_plugins()).load().get(store)
    if defn is None:
        return Position().to_token()
    layout = defn.store_type.changelog_layout
    wanted = {"kv": [], "window": [window_start], "session": [session_start, session_end]}[layout]
    if any(c is None for c in wanted):
        raise SinkError(f"store {store!r} is a {defn.type} store: pass "
                        + ("window_start=COLUMN" if layout == "window" else "session_start= and session_end="))
    kf = field(df, key, "the key")
    if SIMPLE_FORMAT_OF.get(type_name(kf.dataType)) != defn.key_format:
        raise SinkError(f"key column {key!r} has Spark type {kf.dataType.simpleString()}, but store {store!r} "
                        f"has {defn.key_format} keys")
    times = [time_column(df, c, "an entry's time") for c in wanted]
    rows = df.select(F.col(f"`{key}`"), *times).collect()
    if not rows:
        return Position().to_token()
    plain = encode(pa.array([r[0] for r in rows]), defn.key)
    t1, t2 = (pa.array([r[i] for r in rows], pa.int64()) if len(times) >= i else None for i in (1, 2))
    keys = changelog_keys(layout, plain, t1, t2).to_pylist()
    offsets = tombstones(bootstrap_servers, defn, keys, int(time.time() * 1000), timeout)
    return Position({defn.topic: offsets}).to_token()
