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
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import pyarrow as pa

from federator import kafka
from federator.catalog import Catalog, CatalogConflict, changelog_topic
from federator.catalog.definition import StoreDefinition
from federator.plugin import Registry, load_plugins
from federator.query.position import Position
from federator.store.layout import changelog_keys
from federator_spark.sink.checks import (check_rows, check_store, costly, estimate, failing, hash_summary,
                               hash_unless_failing, raise_check_failures, raise_duplicates)
from federator_spark.sink.deletes import live_keys, tombstones, unmarked
from federator_spark.sink.encoding import encode
from federator_spark.sink.errors import SinkError
from federator_spark.sink.plan import SIMPLE_FORMAT_OF, Plan, field, plan, time_column, type_name
from federator_spark.sink.producing import (RESULT_DDL, WriteSpec, drop_driver_producer, driver_producer,
                                  producer_config, write_partition)
from federator_spark.sink.small import Held, fetch_small, fits, produce_small, with_bad
from federator_spark.sink.tasks import PASS2_ARROW_CONF, SPARK_FAILURES, map_in_arrow, session_conf, worker_failure

log = logging.getLogger(__name__)

MODES = ("upsert", "replace")


@dataclass(frozen=True)
class WriteOptions:
    """What ``write_store`` is told beside the DataFrame and the store's name (its keywords)."""

    key: str
    bootstrap_servers: str
    application_id: str
    value: str | Sequence[str] | None = None
    type: str = "kv"
    partitions: int = 8
    window_start: str | None = None
    window_size_ms: int | None = None
    session_start: str | None = None
    session_end: str | None = None
    mode: str = "upsert"
    progress: Callable[[str], None] | None = None
    timeout: float = 120.0
    registry: Registry | None = None
    kafka_config: str | None = None
    global_store: bool = False

    def say(self, msg: str) -> None:
        """One line of progress: to ``progress``, else the log."""
        if self.progress is not None:
            self.progress(msg)
        else:
            log.info("%s", msg)


@dataclass
class _Started:
    """A write planned, its catalog read and driver's producer warmed up meanwhile."""

    plan: Plan
    catalog: Catalog
    store_check: Future  # (the definition to register, whether it exists already)
    warm: Future  # the driver's producer
    producer_config: dict[str, str]
    now_ms: int  # kv records' time: the write's start


@dataclass
class _Checked:
    """Pass 1 passed: the rows to write and what it learned of them."""

    total: int
    fetched: pa.Table | None  # the rows themselves, when few enough came back whole
    to_write: Any  # the rows and whether each fails a check, when not fetched
    on_driver: bool  # few enough rows for the driver to write them, without Python tasks
    defn: StoreDefinition
    exists: bool


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
    return _write(df, store, WriteOptions(
        key=key, value=value, type=type, partitions=partitions, bootstrap_servers=bootstrap_servers,
        application_id=application_id, window_start=window_start, window_size_ms=window_size_ms,
        session_start=session_start, session_end=session_end, mode=mode, progress=progress, timeout=timeout,
        registry=registry, kafka_config=kafka_config, global_store=global_store))


def _write(df: Any, store: str, options: WriteOptions) -> str:
    """``write_store``: plan, check (pass 1), register, produce (pass 2), delete what replace
    mode leaves behind; the consistency token."""
    started = _start(df, store, options)
    rows = df.select(*started.plan.projection, *started.plan.extra)
    write_columns = [c for c in ("k", "v", "t1", "t2") if c in rows.columns]
    staged: list[Any] = []  # the rows Spark caches for both passes, to let go of at the end
    try:
        checked = _check(rows, write_columns, store, started, staged, options)
        _register(started, checked, store, options)
        existing = _existing_keys(checked, store, options)
        results, took = _produce(df, store, checked, existing, started, options)
        offsets, written, seen = _tally(results)
        options.say(f"{store}: wrote {written} records to {checked.defn.topic} in {took:.1f}s"
                    + (f" ({written / took:,.0f} records/s)" if took > 0 and written else ""))
        if existing:
            _delete_gone(existing, seen, offsets, checked.defn, store, started.now_ms, options)
    finally:
        for s in staged:
            s.unpersist()
    return Position({checked.defn.topic: offsets}).to_token()


def _start(df: Any, store: str, o: WriteOptions) -> _Started:
    """The options checked, the write planned, and while Spark runs pass 1: the catalog read,
    and the driver's producer (catalog record, tombstones) fetching its producer id. Neither
    writes anything; a definition that does not fit still fails first."""
    if o.mode not in MODES:
        raise SinkError(f"mode={o.mode!r}: use 'upsert' (add and overwrite keys) or 'replace' (also delete missing keys)")
    if not o.bootstrap_servers or not o.application_id:
        raise SinkError("pass bootstrap_servers='HOST:PORT' and application_id='APP' (the nodes' application id)")
    registry = o.registry or load_plugins()
    config = producer_config(o.bootstrap_servers, o.kafka_config)  # before the driver's first Kafka client
    the_plan = plan(
        df, store, key=o.key, value=o.value, type=o.type, partitions=o.partitions,
        topic=changelog_topic(o.application_id, store) if isinstance(store, str) else "?",
        window_start=o.window_start, window_size_ms=o.window_size_ms,
        session_start=o.session_start, session_end=o.session_end, registry=registry, global_store=o.global_store,
    )
    catalog = Catalog(o.bootstrap_servers, o.application_id, registry)
    pool = ThreadPoolExecutor(1)
    store_check = pool.submit(check_store, catalog, the_plan.defn)
    warm = pool.submit(driver_producer, o.bootstrap_servers)
    pool.shutdown(wait=False)
    return _Started(the_plan, catalog, store_check, warm, config, int(time.time() * 1000))


def _check(rows: Any, write_columns: list[str], store: str, started: _Started, staged: list[Any],
           o: WriteOptions) -> _Checked:
    """Pass 1: every check, in Spark; only the key hashes come back (few rows may come back
    whole, to be written from the driver: spark/sink/small.py). It reads one column: the key
    hash, null where any check fails. Pass 2 reads the rows and whether each fails a check (its
    guard against rows that changed since pass 1), not the hash again."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    the_plan, began = started.plan, time.monotonic()
    fails = failing(the_plan)
    key_hash = hash_unless_failing(the_plan, fails)
    guess = estimate(rows)  # Spark's statistics: whether the driver may write the rows (small.py)
    to_write = None
    try:
        with_hash = rows.select(*write_columns, key_hash)
        fetched = fetch_small(with_hash, guess)
        if fetched is not None:
            total, failed, maybe_duplicates = hash_summary(fetched.column("h"))
        else:
            # Pass 2 computes the rows again unless that costs a shuffle or may give other
            # rows (non-deterministic): then Spark caches them, so both passes see the same rows.
            if costly(rows):
                staged.append(with_hash.persist(StorageLevel.MEMORY_AND_DISK))
                hashes = staged[0].select("h")
                to_write = staged[0].select(*write_columns, F.col("h").isNull().alias("bad"))
            else:  # one DataFrame (one plan to analyze) fewer
                hashes = rows.select(key_hash)
                to_write = rows.select(*write_columns, fails.alias("bad"))
            total, failed, maybe_duplicates = check_rows(hashes)
    except Exception as e:  # a task failed: say why in one line
        started.store_check.result()
        if e.__class__.__name__ in SPARK_FAILURES:
            raise RuntimeError(f"checking store {store!r} failed (nothing was written): "
                               f"{worker_failure(e)}") from e
        raise
    defn, exists = started.store_check.result()
    if failed:
        raise_check_failures(rows, the_plan, store)
    if maybe_duplicates:
        raise_duplicates(rows, the_plan, store)  # a hash collision passes: the exact check finds none
    o.say(f"{store}: {total} rows checked ({time.monotonic() - began:.1f}s)")
    return _Checked(total, fetched, to_write, fetched is not None or fits(total, guess), defn, exists)


def _register(started: _Started, checked: _Checked, store: str, o: WriteOptions) -> None:
    """The store registered in the catalog (the driver's producer writes its record)."""
    defn, producer = checked.defn, started.warm.result()
    try:
        started.catalog.register(defn, producer=producer)
    except CatalogConflict as e:  # another writer registered it meanwhile
        raise SinkError(str(e)) from None
    except BaseException:
        drop_driver_producer(o.bootstrap_servers, producer)
        raise
    if not checked.exists:
        o.say(f"{store}: registered in {started.catalog.topic} "
              f"({defn.type}, {defn.partitions} partitions, topic {defn.topic})")


def _existing_keys(checked: _Checked, store: str, o: WriteOptions) -> list[bytes]:
    """For a replace of a store that exists: the keys in its changelog before the write, sorted
    (those no task marks as written are deleted after); else none."""
    if o.mode != "replace" or not checked.exists:
        return []
    existing = live_keys(o.bootstrap_servers, checked.defn.topic, checked.defn.partitions, o.timeout)
    o.say(f"{store}: {len(existing)} keys in the changelog before the write")
    return sorted(existing)


def _produce(df: Any, store: str, checked: _Checked, existing_keys: list[bytes], started: _Started,
             o: WriteOptions) -> tuple[list[Any], float]:
    """Pass 2: serialize and produce, one Python pass over the rows, on the driver for few rows
    and in Spark's tasks else. (The tasks' result rows, the seconds it took.)"""
    defn, fetched = checked.defn, checked.fetched
    spark = df.sparkSession
    on_driver = checked.on_driver
    index = {k: i for i, k in enumerate(existing_keys)}
    bc = None if not existing_keys else Held(index) if on_driver else spark.sparkContext.broadcast(index)
    spec = WriteSpec(
        bootstrap_servers=o.bootstrap_servers, topic=defn.topic, partitions=defn.partitions,
        layout=defn.store_type.changelog_layout, key=defn.key,
        value=None if started.plan.value_encoded else defn.value,
        now_ms=started.now_ms, producer_config=started.producer_config, flush_timeout=o.timeout, existing=bc,
    )
    write_started = time.monotonic()
    try:
        if on_driver:
            results = produce_small(spec, with_bad(fetched) if fetched is not None else checked.to_write.toArrow())
        else:
            writer = functools.partial(write_partition, spec)
            with session_conf(spark, PASS2_ARROW_CONF):
                results = map_in_arrow(checked.to_write, writer, RESULT_DDL).collect()
    except Exception as e:  # a task failed: say why in one line
        if e.__class__.__name__ in SPARK_FAILURES:
            raise kafka.KafkaUnavailable(f"writing store {store!r} failed: {worker_failure(e)}") from e
        if on_driver and isinstance(e, RuntimeError):  # as a task's failure would say it
            raise kafka.KafkaUnavailable(f"writing store {store!r} failed: {e}") from e
        raise
    finally:
        if bc is not None and not isinstance(bc, Held):
            bc.unpersist()
    return results, time.monotonic() - write_started


def _tally(results: list[Any]) -> tuple[dict[int, int], int, int]:
    """From the tasks' result rows: (partition -> the last offset written, the records written,
    the bitmap over the existing keys of those some task wrote)."""
    offsets: dict[int, int] = {}
    written = 0
    seen = 0
    for r in results:
        if r["partition"] < 0:
            seen |= int.from_bytes(r["seen"], "little")
            continue
        offsets[r["partition"]] = max(offsets.get(r["partition"], -1), r["offset"])
        written += r["records"]
    return offsets, written, seen


def _delete_gone(existing_keys: list[bytes], seen: int, offsets: dict[int, int], defn: StoreDefinition,
                 store: str, now_ms: int, o: WriteOptions) -> None:
    """Tombstones for the existing keys no task wrote, their offsets merged into ``offsets``."""
    gone = unmarked(existing_keys, seen)
    if gone:
        for p, off in tombstones(o.bootstrap_servers, defn, gone, now_ms, o.timeout).items():
            offsets[p] = max(offsets.get(p, -1), off)
    o.say(f"{store}: deleted {len(gone)} keys that are no longer in the DataFrame")


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
