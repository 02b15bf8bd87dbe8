"""Producing (pass 2, worker side): each Spark task serializes its Arrow batches and produces
them with confluent-kafka, and reports the last offset delivered per Kafka partition. Also
the driver's producer (catalog records, tombstones), kept alive the same way."""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from federator import kafka, kafka_properties
from federator.formats import Format
from federator.store.layout import changelog_keys
from federator_spark.sink.encoding import bytes_list, encode
from federator_spark.sink.partitioning import murmur2_partitions

PRODUCER_CONFIG: tuple[tuple[str, Any], ...] = (
    ("linger.ms", 20), ("batch.size", 1_000_000), ("queue.buffering.max.messages", 500_000),
)


def producer_config(bootstrap: str, kafka_config: str | None) -> tuple[tuple[str, Any], ...]:
    """A write's producer settings: the cluster's client properties (the file ``kafka_config``
    names, else those this driver was given for ``bootstrap``, else $FEDERATOR_KAFKA_CONFIG's),
    which the driver's own clients use from now on too and the tasks get in their WriteSpec,
    then PRODUCER_CONFIG."""
    if kafka_config:
        kafka.use_client_properties(bootstrap, kafka_properties.load(kafka_config))
    return (*sorted(kafka.client_properties(bootstrap).values.items()), *PRODUCER_CONFIG)


@dataclass(frozen=True)
class WriteSpec:
    """What a Spark task needs to serialize and produce its rows (pickled into the task)."""

    bootstrap_servers: str
    topic: str
    partitions: int
    layout: str  # the store type's changelog layout: kv, window or session
    key: Format
    value: Format | None  # None: the column holds the bytes already (a JSON document built by Spark)
    now_ms: int  # kv records' time
    # the cluster's client properties (secrets among them: never in a repr), then the producer's
    producer_config: tuple[tuple[str, Any], ...] = field(repr=False)
    flush_timeout: float
    existing: Any = None  # replace mode: Broadcast of {changelog key: index} live before the write


RESULT_SCHEMA = pa.schema([
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("records", pa.int64()),
    pa.field("seen", pa.binary()),
])
RESULT_DDL = "partition int, offset long, records long, seen binary"

# Producers per Python worker process, reused by the tasks it runs (Spark reuses workers): a
# new idempotent producer waits ~0.5 s for its producer id before its first delivery.
# Each worker has two: "bulk" reports failed deliveries only (a delivery report costs a Python
# call and a Message object per record, ~1 us), "last" reports every delivery; it writes each
# task's last record per Kafka partition, after "bulk" has delivered the rest, so its offsets
# are the task's last ones (a write holds each changelog key once, so the order of records
# within it does not matter).
_PRODUCERS: dict[tuple, Any] = {}


def _producer_key(spec: WriteSpec, role: str) -> tuple:
    return spec.bootstrap_servers, spec.producer_config, role


def _producer(spec: WriteSpec, role: str) -> Any:
    key = _producer_key(spec, role)
    p = _PRODUCERS.get(key)
    if p is None:
        extra = {"delivery.report.only.error": True} if role == "bulk" else {}
        p = _PRODUCERS[key] = kafka.producer(spec.bootstrap_servers, **dict(spec.producer_config), **extra)
    return p


def produce_waiting(producer: Any, *args: Any) -> None:
    """produce() when the local queue is full: serve deliveries until there is room."""
    while True:
        producer.poll(0.05)
        try:
            producer.produce(*args)
            return
        except BufferError:
            continue


def write_partition(spec: WriteSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Serialize and produce one Spark partition's rows (columns k, v[, t1[, t2]], bad); yield the
    last offset delivered per Kafka partition and, in replace mode, a bitmap of the
    pre-existing keys it wrote."""
    try:
        yield produce_batches(spec, batches)
    except BaseException:
        # a producer that failed (e.g. a fatal idempotence error) is not reused by later tasks
        forget_producers(spec)
        raise


def forget_producers(spec: WriteSpec) -> None:
    for role in ("bulk", "last"):
        _PRODUCERS.pop(_producer_key(spec, role), None)


def _flush(producer: Any, spec: WriteSpec) -> None:
    remaining = producer.flush(spec.flush_timeout)
    if remaining:
        raise RuntimeError(
            f"{remaining} records to {spec.topic!r} were not delivered within {spec.flush_timeout:.0f}s; "
            f"is the broker at {spec.bootstrap_servers} healthy?"
        )


def produce_batches(spec: WriteSpec, batches: Iterator[pa.RecordBatch]) -> pa.RecordBatch:
    bulk, last = _producer(spec, "bulk"), _producer(spec, "last")
    produce = bulk.produce
    topic, nparts, layout = spec.topic, spec.partitions, spec.layout
    failed: dict = {}  # err -> message: bulk's failed deliveries (successes are not reported)
    on_failure = failed.__setitem__  # C-level: no Python frame per report
    held: list[tuple | None] = [None] * nparts  # per partition: its last record so far, for "last"
    counts = np.zeros(nparts, dtype=np.int64)
    existing = spec.existing.value if spec.existing is not None else None
    seen = bytearray((len(existing) + 7) // 8) if existing else None  # bit i: existing key i was written
    for batch in batches:
        n = batch.num_rows
        if n == 0:
            continue
        if pc.any(batch.column("bad")).as_py():  # pass 1 saw none: the DataFrame changed in between
            raise RuntimeError("a row fails a check in the write pass although every row passed pass 1's checks: "
                               "is the DataFrame non-deterministic? Records before it may have been written")
        names = batch.schema.names
        plain = encode(batch.column("k"), spec.key)
        t1 = batch.column("t1") if "t1" in names else None
        t2 = batch.column("t2") if "t2" in names else None
        # every record goes to the partition of its plain key, whatever the layout
        parts_np = murmur2_partitions(plain, nparts).to_numpy()
        counts += np.bincount(parts_np, minlength=nparts)
        keys = bytes_list(changelog_keys(layout, plain, t1, t2))
        values = bytes_list(encode(batch.column("v"), spec.value))
        # record time (docs/reference/stores.md): kv the write's start, window its start, session its end
        time_col = {"kv": None, "window": t1, "session": t2}[layout]
        times = time_col.to_numpy().tolist() if time_col is not None else None
        # this batch's last row per partition is held back; the one it replaces goes to bulk
        rev_first = np.unique(parts_np[::-1], return_index=True)
        hold = {int(p): n - 1 - int(i) for p, i in zip(*rev_first)}
        for p, i in hold.items():
            if held[p] is not None:
                _produce_one(bulk, topic, held[p], on_failure)
            held[p] = (keys[i], values[i], p, spec.now_ms if times is None else times[i])
        parts = parts_np.tolist()
        start = 0
        for stop in [*sorted(hold.values()), n]:  # the runs of rows between the held ones
            ts = itertools.repeat(spec.now_ms) if times is None else times[start:stop]
            for p, t, k, v in zip(parts[start:stop], ts, keys[start:stop], values[start:stop]):
                try:  # positional: (topic, value, key, partition, callback, on_delivery alias, timestamp)
                    produce(topic, v, k, p, on_failure, None, t)
                except BufferError:
                    produce_waiting(bulk, topic, v, k, p, on_failure, None, t)
            start = stop + 1
        bulk.poll(0)
        if existing:
            get = existing.get
            for k in keys:
                i = get(k)
                if i is not None:
                    seen[i >> 3] |= 1 << (i & 7)
    _flush(bulk, spec)
    if failed:
        err = next(iter(failed))
        raise RuntimeError(f"producing to {topic}[{failed[err].partition()}] failed: {err.str()}")
    return _results(_deliver_held(last, spec, held), counts, seen, topic)


def _deliver_held(last: Any, spec: WriteSpec, held: list[tuple | None]) -> list[dict]:
    """Each partition's held record produced after every other record was delivered (so it
    comes after them in its partition): per partition, d[None] = the delivered message, d[err]
    = its failures."""
    reports: list[dict] = [{} for _ in range(spec.partitions)]
    for p, rec in enumerate(held):
        if rec is not None:
            _produce_one(last, spec.topic, rec, reports[p].__setitem__)
    _flush(last, spec)
    return reports


def _results(reports: list[dict], counts: np.ndarray, seen: bytearray | None, topic: str) -> pa.RecordBatch:
    """The task's result rows (RESULT_SCHEMA): per partition its last offset and records written,
    and the bitmap of existing keys written."""
    rows_p, rows_o, rows_n, rows_s = [], [], [], []
    for p, d in enumerate(reports):
        errors = [e for e in d if e is not None]
        if errors:
            raise RuntimeError(f"producing to {topic}[{p}] failed: {errors[0].str()}")
        if d.get(None) is not None:
            rows_p.append(p)
            rows_o.append(d[None].offset())
            rows_n.append(int(counts[p]))
            rows_s.append(None)
    if seen is not None and any(seen):
        rows_p.append(-1)
        rows_o.append(-1)
        rows_n.append(0)
        rows_s.append(bytes(seen))
    return pa.RecordBatch.from_arrays(
        [pa.array(rows_p, pa.int32()), pa.array(rows_o, pa.int64()), pa.array(rows_n, pa.int64()),
         pa.array(rows_s, pa.binary())],
        schema=RESULT_SCHEMA,
    )


def _produce_one(producer: Any, topic: str, record: tuple, callback: Callable) -> None:
    k, v, p, t = record
    try:
        producer.produce(topic, v, k, p, callback, None, t)
    except BufferError:
        produce_waiting(producer, topic, v, k, p, callback, None, t)


# The driver's producer (catalog records, tombstones), kept like the workers' ones: a new
# idempotent producer waits ~0.5 s for its producer id before its first delivery.
_DRIVER_PRODUCERS: dict[str, Any] = {}
_DRIVER_LOCK = threading.Lock()


def driver_producer(bootstrap: str) -> Any:
    with _DRIVER_LOCK:
        p = _DRIVER_PRODUCERS.get(bootstrap)
        if p is None:
            p = _DRIVER_PRODUCERS[bootstrap] = kafka.producer(bootstrap, **dict(PRODUCER_CONFIG))
        return p


def drop_driver_producer(bootstrap: str, producer: Any) -> None:
    """Forget a producer that failed (it may be in a fatal state); the next write makes another."""
    with _DRIVER_LOCK:
        if _DRIVER_PRODUCERS.get(bootstrap) is producer:
            del _DRIVER_PRODUCERS[bootstrap]
