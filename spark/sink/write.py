"""Write any Spark DataFrame into a Federator store.

``write_store(df, "name", key="player", value=[...], bootstrap_servers=..., application_id=...)``
registers the store in the catalog (or checks the definition already there), then produces
every row from the Spark partition that holds it, with confluent-kafka, in the changelog
layouts of DESIGN.md:

- kv:      key bytes -> value bytes, record time = the write's start
- window:  key + 8-byte window start + 4-byte seqnum 0, record time = the window start
- session: key + 8-byte session end + 8-byte session start, record time = the session end

Every record goes to the partition of its plain key (Kafka's murmur2, passed explicitly).
It returns a consistency token: the last offset written to each changelog partition, so a
reader that passes it to ``/v1/sql`` sees this write (read-your-writes).

Bad input fails before anything is written (not even the catalog entry), with a SinkError
naming the column and saying what to do. ``mode="replace"`` also deletes, with tombstones,
the keys that the changelog holds but the DataFrame no longer has.

Two Spark jobs. Pass 1 runs in Spark alone (no Python worker): every check is a row
condition (null keys, NaN in JSON doubles, ...), and each row gets a 64-bit hash of its
changelog key, null where a check fails; only the hashes come back, sorted on the driver to
find duplicates (or grouped by Spark for very large writes), with an exact group-by only when
two hashes match, and a job of its own to count each check only when some row failed. Pass 2
(mapInArrow) serializes each Arrow batch at once (keys, values, Kafka's murmur2 vectorized)
and produces it: the per-record work is one ``produce`` call, and only failed deliveries are
reported back to Python; each task's last record per partition is produced after the rest is
delivered, and its offset goes into the token. The rows are computed by both passes; they are
cached in between only when computing them costs a shuffle or may give other rows (a
non-deterministic plan). Nothing is written before pass 1 has passed.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from federator import kafka
from federator.catalog import Catalog, CatalogConflict, DefinitionError, StoreDefinition, changelog_topic
from federator.catalog.definition import RESERVED_COLUMNS
from federator.plugin import Registry, load_plugins
from federator.query.position import Position

log = logging.getLogger(__name__)

__all__ = ["SinkError", "write_store", "delete_keys", "murmur2_partitions", "SIMPLE_FORMAT_OF", "JSON_FIELD_OF"]

MODES = ("upsert", "replace")


class SinkError(ValueError):
    """The DataFrame or the arguments cannot be written as asked; nothing was written."""


# ---- Spark types -> formats ---------------------------------------------------------------
# Keys and single-column values: the Spark type decides the format (Kafka's serializers).
SIMPLE_FORMAT_OF = {
    "StringType": "string",
    "LongType": "long",
    "IntegerType": "int",
    "DoubleType": "double",
    "BinaryType": "bytes",
}
# JSON record fields.
JSON_FIELD_OF = {
    "StringType": "string",
    "LongType": "long",
    "IntegerType": "int",
    "DoubleType": "double",
    "BooleanType": "boolean",
    "TimestampType": "timestamp",
}
# What to cast a close-but-unsupported type to, for the error message.
_CAST_HINT = {
    "ShortType": "int", "ByteType": "int", "FloatType": "double", "DecimalType": "double or long",
    "TimestampNTZType": "timestamp", "DateType": "timestamp", "VarcharType": "string", "CharType": "string",
}


def _type_name(dtype: Any) -> str:
    return type(dtype).__name__


def _cast_hint(col: str, dtype: Any, allowed: str) -> str:
    hint = _CAST_HINT.get(_type_name(dtype))
    cast = f"; cast it first, e.g. F.col({col!r}).cast({hint.split()[0]!r})" if hint else ""
    return f"use one of: {allowed}{cast}"


# ---- Kafka's murmur2, vectorized with numpy -------------------------------------------------
_M = 0x5BD1E995
_SEED = 0x9747B28C


def _murmur2_uniform(data: pa.Buffer | None, start: int, length: int, n: int) -> Any:
    """murmur2 (uint32 numpy array) of ``n`` keys of ``length`` bytes each, stored back to back
    in ``data`` from byte ``start``. uint32 arithmetic wraps modulo 2**32, as Java's int does."""
    import numpy as np

    m = np.uint32(_M)
    h = np.full(n, (_SEED ^ length) & 0xFFFFFFFF, dtype=np.uint32)
    if length:
        rows = np.frombuffer(data, dtype=np.uint8, count=n * length, offset=start).reshape(n, length)
        end = length - (length & 3)
        # the 4-byte words (little-endian, as murmur2 reads them), one column per word
        words = np.ascontiguousarray(rows[:, :end]).view("<u4") if end else None
        for i in range(end // 4):
            k = words[:, i] * m
            k ^= k >> np.uint32(24)
            k *= m
            h *= m
            h ^= k
        rest = length & 3
        if rest == 3:
            h ^= rows[:, end + 2].astype(np.uint32) << np.uint32(16)
        if rest >= 2:
            h ^= rows[:, end + 1].astype(np.uint32) << np.uint32(8)
        if rest >= 1:
            h ^= rows[:, end].astype(np.uint32)
            h *= m
    h ^= h >> np.uint32(13)
    h *= m
    h ^= h >> np.uint32(15)
    return h


def _binary_start(arr: pa.Array) -> int:
    """Byte position of the first value of a (possibly sliced) binary array in its data buffer."""
    offsets = pa.Array.from_buffers(pa.int32(), len(arr) + 1, [None, arr.buffers()[1]], offset=arr.offset)
    return offsets[0].as_py()


def murmur2_partitions(keys: pa.Array, partitions: int) -> pa.Array:
    """``(murmur2(key) & 0x7fffffff) % partitions`` for every key (no nulls), as int32:
    ``federator.partitioner.partition_for`` for a whole batch at once."""
    import numpy as np

    n = len(keys)
    if n == 0:
        return pa.array([], pa.int32())
    if pa.types.is_fixed_size_binary(keys.type):
        width = keys.type.byte_width
        h = _murmur2_uniform(keys.buffers()[1], keys.offset * width, width, n)
    else:
        if keys.type != pa.binary():
            keys = keys.cast(pa.binary())
        lengths = pc.binary_length(keys)
        mm = pc.min_max(lengths).as_py()
        if mm["min"] == mm["max"]:
            h = _murmur2_uniform(keys.buffers()[2], _binary_start(keys), mm["min"], n)
        else:  # one pass per key length, then back into row order
            h = np.empty(n, dtype=np.uint32)
            for length in pc.unique(lengths).to_pylist():
                idx = pc.indices_nonzero(pc.equal(lengths, length))
                sub = keys.take(idx)
                h[idx.to_numpy()] = _murmur2_uniform(sub.buffers()[2], _binary_start(sub), length, len(sub))
    return pa.array(((h & np.uint32(0x7FFFFFFF)) % np.uint32(partitions)).astype(np.int32))


# ---- serialization (worker side) -----------------------------------------------------------
_NUMPY_DTYPE = {"long": ">i8", "int": ">i4", "double": ">f8"}  # Kafka's big-endian serializers


def _serialize(arr: pa.Array, fmt: str) -> pa.Array:
    """A column (no nulls) as the bytes of ``fmt``: a binary or fixed-size binary array."""
    if fmt in _NUMPY_DTYPE:
        import numpy as np

        dtype = np.dtype(_NUMPY_DTYPE[fmt])
        data = np.asarray(arr.to_numpy(zero_copy_only=False), dtype=dtype.newbyteorder("=")).astype(dtype)
        return pa.Array.from_buffers(pa.binary(dtype.itemsize), len(arr), [None, pa.py_buffer(data.tobytes())])
    # string (UTF-8, as StringSerializer), bytes, or a JSON document built by Spark
    return arr.cast(pa.binary())


def _fixed(n: int, width: int, data: bytes) -> pa.Array:
    return pa.Array.from_buffers(pa.binary(width), n, [None, pa.py_buffer(data)])


def _suffixed(keys: pa.Array, layout: str, t1: pa.Array | None, t2: pa.Array | None) -> pa.Array:
    """Changelog keys: the plain keys, plus window start + seqnum 0 or session end + start."""
    if layout == "kv":
        return keys.cast(pa.binary())
    import numpy as np

    n = len(keys)
    if layout == "window":
        suffix = np.zeros(n, dtype=[("start", ">i8"), ("seq", ">i4")])
        suffix["start"] = t1.to_numpy(zero_copy_only=False)
        width = 12
    else:
        suffix = np.zeros(n, dtype=[("end", ">i8"), ("start", ">i8")])
        suffix["end"], suffix["start"] = t2.to_numpy(zero_copy_only=False), t1.to_numpy(zero_copy_only=False)
        width = 16
    tail = _fixed(n, width, suffix.tobytes()).cast(pa.binary())
    return pc.binary_join_element_wise(keys.cast(pa.binary()), tail, b"")


def _bytes_list(arr: pa.Array) -> list[bytes]:
    """A binary or fixed-size binary array (no nulls) as a list of bytes objects. Fixed-size
    goes through numpy: pyarrow's to_pylist of fixed-size binary is ~15x slower."""
    if pa.types.is_fixed_size_binary(arr.type):
        import numpy as np

        width = arr.type.byte_width
        return np.frombuffer(arr.buffers()[1], dtype=f"V{width}", count=len(arr),
                             offset=arr.offset * width).tolist()
    return arr.to_pylist()


@dataclass(frozen=True)
class _WriteSpec:
    """What a Spark task needs to serialize and produce its rows (pickled into the task)."""

    bootstrap_servers: str
    topic: str
    partitions: int
    layout: str  # kv, window or session
    key_format: str
    value_format: str  # a simple format, or "json" (the column already holds the document)
    now_ms: int  # kv records' time
    producer_config: tuple[tuple[str, Any], ...]
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


def _producer_key(spec: _WriteSpec, role: str) -> tuple:
    return spec.bootstrap_servers, spec.producer_config, role


def _producer(spec: _WriteSpec, role: str) -> Any:
    key = _producer_key(spec, role)
    p = _PRODUCERS.get(key)
    if p is None:
        extra = {"delivery.report.only.error": True} if role == "bulk" else {}
        p = _PRODUCERS[key] = kafka.producer(spec.bootstrap_servers, **dict(spec.producer_config), **extra)
    return p


def _produce_waiting(producer: Any, *args: Any) -> None:
    """produce() when the local queue is full: serve deliveries until there is room."""
    while True:
        producer.poll(0.05)
        try:
            producer.produce(*args)
            return
        except BufferError:
            continue


def _write_partition(spec: _WriteSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Serialize and produce one Spark partition's rows (columns k, v[, t1[, t2]], bad); yield the
    last offset delivered per Kafka partition and, in replace mode, a bitmap of the
    pre-existing keys it wrote."""
    try:
        yield _produce_batches(spec, batches)
    except BaseException:
        # a producer that failed (e.g. a fatal idempotence error) is not reused by later tasks
        for role in ("bulk", "last"):
            _PRODUCERS.pop(_producer_key(spec, role), None)
        raise


def _flush(producer: Any, spec: _WriteSpec) -> None:
    remaining = producer.flush(spec.flush_timeout)
    if remaining:
        raise RuntimeError(
            f"{remaining} records to {spec.topic!r} were not delivered within {spec.flush_timeout:.0f}s; "
            f"is the broker at {spec.bootstrap_servers} healthy?"
        )


def _produce_batches(spec: _WriteSpec, batches: Iterator[pa.RecordBatch]) -> pa.RecordBatch:
    import itertools

    import numpy as np

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
        plain = _serialize(batch.column("k"), spec.key_format)
        t1 = batch.column("t1") if "t1" in names else None
        t2 = batch.column("t2") if "t2" in names else None
        parts_np = murmur2_partitions(plain, nparts).to_numpy()
        counts += np.bincount(parts_np, minlength=nparts)
        keys = _bytes_list(plain if layout == "kv" else _suffixed(plain, layout, t1, t2))
        values = _bytes_list(_serialize(batch.column("v"), spec.value_format))
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
                    _produce_waiting(bulk, topic, v, k, p, on_failure, None, t)
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
    # every other record is delivered: the held records come after them in their partitions
    reports: list[dict] = [{} for _ in range(nparts)]  # d[None] = the delivered message, d[err] = failures
    for p, rec in enumerate(held):
        if rec is not None:
            _produce_one(last, topic, rec, reports[p].__setitem__)
    _flush(last, spec)
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
        _produce_waiting(producer, topic, v, k, p, callback, None, t)


# Pass 2's Arrow batches, unless the session sets this itself. Spark checks the byte limit by
# measuring its Arrow vectors after every row (~10% of the JVM's time in pass 2); at its
# largest value it skips that, and the record limit (maxRecordsPerBatch, 10,000 by default)
# alone bounds a batch. Larger batches measured no faster.
PASS2_ARROW_CONF = {"spark.sql.execution.arrow.maxBytesPerBatch": str(2**31 - 1)}


@contextlib.contextmanager
def _session_conf(spark: Any, conf: dict[str, str]) -> Iterator[None]:
    """Set ``conf`` on the session for the block (keys the session sets itself are left alone),
    then take it back."""
    ours = {k: v for k, v in conf.items() if spark.conf.get(k, None) is None}
    for k, v in ours.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k in ours:
            spark.conf.unset(k)


def _map_in_arrow(df: Any, func: Callable, ddl: str) -> Any:
    """df.mapInArrow without the pandas that PySpark's public method insists on importing
    (the Arrow path itself never uses pandas)."""
    try:
        import pandas  # noqa: F401
    except ImportError:
        pass
    else:
        return df.mapInArrow(func, ddl)
    from pyspark.rdd import PythonEvalType
    from pyspark.sql import DataFrame
    from pyspark.sql.udf import _create_udf

    udf = _create_udf(func, returnType=ddl, evalType=PythonEvalType.SQL_MAP_ARROW_ITER_UDF)
    column = udf(*[df[c] for c in df.columns])
    return DataFrame(df._jdf.mapInArrow(column._jc, False, None), df.sparkSession)


# ---- the driver side --------------------------------------------------------------------
@dataclass
class _Plan:
    defn: StoreDefinition
    projection: list[Any]  # Spark columns k, v, [t1, [t2]]: what the writer reads
    extra: list[Any]  # more columns that only the checks read
    checks: list[tuple[str, Any]]  # (message if {n} rows fail, row condition over projection + extra)
    unique_by: list[str]  # projection columns that identify a changelog key
    key_label: str


def _field(df: Any, name: Any, role: str) -> Any:
    if not isinstance(name, str):
        raise SinkError(f"{role} must be a column name (str), got {type(name).__name__} {name!r}")
    for f in df.schema.fields:
        if f.name == name:
            return f
    lowered = [f.name for f in df.schema.fields if f.name.lower() == name.lower()]
    near = f" (did you mean {lowered[0]!r}?)" if lowered else ""
    raise SinkError(
        f"column {name!r} ({role}) is not in the DataFrame{near}; its columns are "
        f"{', '.join(df.columns) or 'none'}"
    )


def _time_column(df: Any, name: Any, role: str) -> Any:
    """A window/session time column as epoch milliseconds (long)."""
    from pyspark.sql import functions as F

    f = _field(df, name, role)
    t = _type_name(f.dataType)
    if t == "TimestampType":
        return F.unix_millis(F.col(f"`{name}`"))
    if t == "LongType":
        return F.col(f"`{name}`")
    raise SinkError(
        f"column {name!r} ({role}) has Spark type {f.dataType.simpleString()}; it must be a timestamp or a long "
        f"of epoch milliseconds: convert it first, e.g. F.col({name!r}).cast('timestamp') or F.unix_millis(...)"
    )


def changelog_layout(registry: Registry, type: str) -> str:
    """How records of a store type are laid out in its changelog: kv, window or session (the
    store type says which; a plugin's too)."""
    try:
        return registry.store_type(type).changelog_layout
    except KeyError:
        raise SinkError(f"type={type!r}: the sink writes {', '.join(registry.store_types)} stores; "
                        f"no installed plugin provides {type!r} (`federator plugins` lists them)") from None


def _plan(
    df: Any, store: str, *, key: Any, value: Any, type: str, partitions: int, topic: str,
    window_start: Any, window_size_ms: Any, session_start: Any, session_end: Any, registry: Registry,
) -> _Plan:
    from pyspark.sql import functions as F

    layout = changelog_layout(registry, type)
    if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
        raise SinkError(f"partitions={partitions!r}: pass a positive integer (the changelog topic's partition count)")
    # window/session arguments belong to their store types
    given = {"window_start": window_start, "window_size_ms": window_size_ms,
             "session_start": session_start, "session_end": session_end}
    wanted = {"kv": (), "window": ("window_start", "window_size_ms"), "session": ("session_start", "session_end")}[layout]
    for arg, val in given.items():
        if arg in wanted and val is None:
            raise SinkError(f"a {type} store needs {arg}=...: "
                            + ("the column of window starts and the window size in ms" if layout == "window"
                               else "the columns of session starts and ends"))
        if arg not in wanted and val is not None:
            raise SinkError(f"{arg} is only for {'window' if arg.startswith('window') else 'session'} stores, "
                            f"not {type} stores; drop it or pass type=...")
    if layout == "window" and (isinstance(window_size_ms, bool) or not isinstance(window_size_ms, int)
                             or window_size_ms < 1):
        raise SinkError(f"window_size_ms={window_size_ms!r}: pass the window size as a positive integer "
                        "of milliseconds")

    kf = _field(df, key, "the key")
    key_format = SIMPLE_FORMAT_OF.get(_type_name(kf.dataType))
    if key_format is None:
        raise SinkError(
            f"key column {key!r} has Spark type {kf.dataType.simpleString()}, which no key format fits; "
            + _cast_hint(key, kf.dataType, "string, long, int, double, binary")
        )
    time_cols = [c for c in (window_start, session_start, session_end) if c is not None]
    if value is None:  # every other column
        value = [c for c in df.columns
                 if c != key and c not in time_cols and c.lower() not in RESERVED_COLUMNS]
        if not value:
            raise SinkError(f"the DataFrame has no value column besides the key {key!r}; "
                            "pass value=COLUMN or value=[COLUMNS]")
        if len(value) == 1:
            value = value[0]
    col = lambda name: F.col(f"`{name}`")  # noqa: E731  (names may hold dots)
    checks: list[tuple[str, Any]] = []
    extra: list[Any] = []  # projected only for the checks
    checks.append((f"key column {key!r} has {{n}} null values; a store key cannot be null: "
                   f"filter them out (df.where(F.col({key!r}).isNotNull())) or fill them", F.col("k").isNull()))
    if isinstance(value, str):
        vf = _field(df, value, "the value")
        value_format = SIMPLE_FORMAT_OF.get(_type_name(vf.dataType))
        if value_format is None:
            allowed = "string, long, int, double, binary (or pass value=[columns] for a JSON record)"
            raise SinkError(f"value column {value!r} has Spark type {vf.dataType.simpleString()}, which no value "
                            f"format fits; " + _cast_hint(value, vf.dataType, allowed))
        value_expr = col(value)
        value_fields: tuple[tuple[str, str], ...] = ()
        value_name = value
        checks.append((f"value column {value!r} has {{n}} null values; a null value would delete its key: "
                       f"filter them out or fill them (df.fillna)", F.col("v").isNull()))
    elif isinstance(value, (list, tuple)) and value:
        if len(set(value)) != len(value):
            raise SinkError(f"value lists a column twice: {list(value)!r}")
        fields, parts = [], []
        for name in value:
            vf = _field(df, name, "a value field")
            ftype = JSON_FIELD_OF.get(_type_name(vf.dataType))
            if ftype is None:
                raise SinkError(
                    f"value column {name!r} has Spark type {vf.dataType.simpleString()}, which no JSON field type "
                    f"fits; " + _cast_hint(name, vf.dataType, "string, long, int, double, boolean, timestamp")
                )
            fields.append((name, ftype))
            parts.append((F.unix_millis(col(name)) if ftype == "timestamp" else col(name)).alias(name))
            if ftype == "double":
                flag = f"x{len(extra)}"
                extra.append((F.isnan(col(name)) | (F.abs(col(name)) == float("inf"))).alias(flag))
                checks.append((f"value column {name!r} has {{n}} NaN or infinite values, which JSON cannot hold: "
                               f"replace them (e.g. F.nanvl) or write the column as a simple double value",
                               F.col(flag)))
        value_expr = F.to_json(F.struct(*parts), {"ignoreNullFields": "false"})
        value_format, value_fields, value_name = "json", tuple(fields), "value"
    else:
        raise SinkError(f"value must be a column name, a non-empty list of column names, or None; got {value!r}")

    projection = [col(key).alias("k"), value_expr.alias("v")]
    unique_by = ["k"]
    if layout == "window":
        t1 = _time_column(df, window_start, "the window start")
        projection.append(t1.alias("t1"))
        unique_by.append("t1")
        t1 = F.col("t1")
        checks.append((f"window start column {window_start!r} has {{n}} null values; every window needs its start",
                       t1.isNull()))
        checks.append((f"window start column {window_start!r} has {{n}} values before 1970-01-01; window starts are "
                       f"non-negative epoch milliseconds", t1 < 0))
    elif layout == "session":
        t1 = _time_column(df, session_start, "the session start")
        t2 = _time_column(df, session_end, "the session end")
        projection += [t1.alias("t1"), t2.alias("t2")]
        unique_by += ["t1", "t2"]
        t1, t2 = F.col("t1"), F.col("t2")
        for c, name, what in ((t1, session_start, "start"), (t2, session_end, "end")):
            checks.append((f"session {what} column {name!r} has {{n}} null values; every session needs its {what}",
                           c.isNull()))
            checks.append((f"session {what} column {name!r} has {{n}} values before 1970-01-01; session times are "
                           f"non-negative epoch milliseconds", c < 0))
        checks.append((f"{{n}} sessions end ({session_end!r}) before they start ({session_start!r}); "
                       f"swap the columns or fix the rows", t2 < t1))

    try:
        defn = StoreDefinition(
            name=store, type=type, topic=topic, partitions=partitions, key_format=key_format, key_name=key,
            value_format=value_format, value_name=value_name, value_fields=value_fields,
            window_size_ms=window_size_ms if layout == "window" else None, types=registry,
        )
    except DefinitionError as e:
        raise SinkError(f"{e}; rename the column in the DataFrame (withColumnRenamed) "
                        "or pick another store name") from None
    what = {"kv": "key", "window": "key and window start", "session": "key and session start/end"}[layout]
    label = f"{what} ({', '.join(repr(c) for c in [key, *time_cols])})"
    return _Plan(defn, projection, extra, checks, unique_by, label)


def _check_store(catalog: Catalog, defn: StoreDefinition) -> tuple[StoreDefinition, bool]:
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
        from dataclasses import replace

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


def _live_keys(bootstrap: str, topic: str, partitions: int, timeout: float) -> set[bytes]:
    """Changelog keys whose latest record is not a tombstone, read to each partition's end
    (the fetch path's end-of-partition event: tansu's reported high watermark is wrong)."""
    from confluent_kafka import KafkaError, TopicPartition

    consumer = kafka.reader(bootstrap, **{"fetch.wait.max.ms": 5})  # read to the end once, not tailing
    live: dict[bytes, bool] = {}
    done: set[int] = set()
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        deadline = time.monotonic() + timeout
        while len(done) < partitions:
            if time.monotonic() > deadline:
                raise kafka.KafkaUnavailable(
                    f"reading {topic!r} to its end timed out after {timeout:.0f}s (partitions done: {sorted(done)})"
                )
            for m in kafka.next_batch(consumer, 10_000, 0.5):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        done.add(m.partition())
                        continue
                    raise kafka.KafkaUnavailable(f"reading {topic!r}: {err.str()}")
                k = m.key()
                if k is not None:
                    live[k] = m.value() is not None
    finally:
        consumer.close()
    return {k for k, alive in live.items() if alive}


# The driver's producer (catalog records, tombstones), kept like the workers' ones: a new
# idempotent producer waits ~0.5 s for its producer id before its first delivery.
_DRIVER_PRODUCERS: dict[str, Any] = {}
_DRIVER_LOCK = threading.Lock()


def _driver_producer(bootstrap: str) -> Any:
    with _DRIVER_LOCK:
        p = _DRIVER_PRODUCERS.get(bootstrap)
        if p is None:
            p = _DRIVER_PRODUCERS[bootstrap] = kafka.producer(bootstrap, **dict(PRODUCER_CONFIG))
        return p


def _drop_driver_producer(bootstrap: str, producer: Any) -> None:
    """Forget a producer that failed (it may be in a fatal state); the next write makes another."""
    with _DRIVER_LOCK:
        if _DRIVER_PRODUCERS.get(bootstrap) is producer:
            del _DRIVER_PRODUCERS[bootstrap]


_SUFFIX_LEN = {"kv": 0, "window": 12, "session": 16}


def _tombstones(bootstrap: str, defn: StoreDefinition, keys: Sequence[bytes], now_ms: int,
                timeout: float) -> dict[int, int]:
    """Delete ``keys`` (changelog keys); the last offset per partition."""
    cut = _SUFFIX_LEN[defn.store_type.changelog_layout]
    parts = murmur2_partitions(pa.array([k[: len(k) - cut] for k in keys], pa.binary()), defn.partitions)
    producer = _driver_producer(bootstrap)
    try:
        return _tombstones_with(producer, bootstrap, defn, keys, parts.to_pylist(), now_ms, timeout)
    except BaseException:
        _drop_driver_producer(bootstrap, producer)
        raise


def _tombstones_with(producer: Any, bootstrap: str, defn: StoreDefinition, keys: Sequence[bytes],
                     parts: list[int], now_ms: int, timeout: float) -> dict[int, int]:
    reports: list[dict] = [{} for _ in range(defn.partitions)]
    for k, p in zip(keys, parts):
        try:
            producer.produce(defn.topic, None, k, p, reports[p].__setitem__, None, now_ms)
        except BufferError:
            _produce_waiting(producer, defn.topic, None, k, p, reports[p].__setitem__, None, now_ms)
    if producer.flush(timeout):
        raise kafka.KafkaUnavailable(f"tombstones to {defn.topic!r} were not delivered within {timeout:.0f}s")
    out = {}
    for p, d in enumerate(reports):
        errors = [e for e in d if e is not None]
        if errors:
            raise kafka.KafkaUnavailable(f"deleting keys in {defn.topic}[{p}] failed: {errors[0].str()}")
        if d.get(None) is not None:
            out[p] = d[None].offset()
    return out


def _unmarked(keys: list[bytes], bitmap: int) -> list[bytes]:
    """The keys whose bit is not set."""
    raw = bitmap.to_bytes((len(keys) + 7) // 8, "little")
    out = []
    for byte_index, b in enumerate(raw):
        if b != 0xFF:
            for bit in range(8):
                i = byte_index * 8 + bit
                if i < len(keys) and not (b >> bit) & 1:
                    out.append(keys[i])
    return out


# ---- the checks that need every row -------------------------------------------------------
PRODUCER_CONFIG: tuple[tuple[str, Any], ...] = (
    ("linger.ms", 20), ("batch.size", 1_000_000), ("queue.buffering.max.messages", 500_000),
)
# Up to this many rows (as Spark's plan statistics estimate them) the duplicate check sorts the
# 8-byte key hashes on the driver (8 MB per million rows); above it, or without an estimate, a
# Spark group-by on the hashes keeps the driver's memory flat.
DRIVER_HASH_ROWS = 4_000_000
_SPARK_FAILURES = ("PythonException", "Py4JJavaError", "SparkRuntimeException")


def _key_hash(columns: Sequence[str]) -> Any:
    """A 64-bit hash of what identifies a changelog key (computed by Spark, next to the data)."""
    from pyspark.sql import functions as F

    return F.xxhash64(*[F.col(c) for c in columns])


def _estimated_rows(df: Any) -> int | None:
    """Spark's estimate of ``df``'s row count: exact for ranges and local data, else its size
    estimate over 8 bytes (for files that is their compressed size, so it may be off a few
    times either way: the driver path holds 8 bytes per row)."""
    try:
        stats = df._jdf.queryExecution().optimizedPlan().stats()
        count = stats.rowCount()
        # str(): py4j hands Scala BigInts over as Python ints (which have no toString)
        return int(str(count.get())) if count.isDefined() else int(str(stats.sizeInBytes())) // 8
    except Exception:  # an internal API: without it, take the path that fits any size
        log.debug("no row estimate for the duplicate check", exc_info=True)
        return None


def _costly(df: Any) -> bool:
    """Whether computing ``df`` a second time (pass 2) costs a shuffle, or could give other rows
    than pass 1 checked: then the rows are cached between the passes."""
    try:
        qe = df._jdf.queryExecution()
        return not qe.optimizedPlan().deterministic() or "Exchange" in qe.executedPlan().toString()
    except Exception:  # an internal API: without it, caching is the safe side
        log.debug("cannot inspect the plan; caching the rows between the passes", exc_info=True)
        return True


def _check_rows(hashes: Any) -> tuple[int, int, bool]:
    """Pass 1, in Spark alone (no Python worker): over ``hashes`` (one column ``h``, null where
    a row fails some check), the rows, how many fail and whether two rows share a key hash
    (every duplicate does; a hash collision may too)."""
    from pyspark.sql import functions as F

    estimate = _estimated_rows(hashes)
    if estimate is not None and estimate <= DRIVER_HASH_ROWS:
        import numpy as np

        h = hashes.toArrow().column("h")
        failed = h.null_count
        if failed:
            return len(h), failed, False
        arr = np.sort(h.to_numpy())
        return len(arr), 0, bool(len(arr) > 1 and (arr[1:] == arr[:-1]).any())
    n = F.col("n")
    per_hash = hashes.groupBy("h").agg(F.count(F.lit(1)).alias("n"))
    r = per_hash.agg(F.sum(n).alias("total"), F.sum(F.when(F.col("h").isNull(), n)).alias("failed"),
                     F.max(F.when(F.col("h").isNotNull(), n)).alias("most")).first()
    return int(r["total"] or 0), int(r["failed"] or 0), bool((r["most"] or 0) > 1)


def _raise_check_failures(rows: Any, plan: _Plan, store: str) -> None:
    """Count each check's failures (a job of its own: only when some row failed) and raise
    the first check that failed."""
    from pyspark.sql import functions as F

    counts = rows.agg(*[F.count(F.when(cond, 1)).alias(f"c{i}") for i, (_, cond) in enumerate(plan.checks)]).first()
    for i, (msg, _) in enumerate(plan.checks):
        if counts[f"c{i}"]:
            raise SinkError(f"{msg.format(n=counts[f'c{i}'])} (store {store!r}; nothing was written)")
    raise RuntimeError(f"pass 1 saw rows failing a check, but counting found none (store {store!r}; "
                       "nothing was written): is the DataFrame non-deterministic?")


def _raise_duplicates(rows: Any, plan: _Plan, store: str) -> None:
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


def _worker_failure(e: Exception) -> str:
    """The Python error a Spark task died of (the last traceback's exception line), in one line."""
    text = str(e)
    at = text.rfind("Traceback (most recent call last):")
    lines = text[at:].splitlines()[1:] if at >= 0 else text.splitlines()
    msg = ""
    for i, ln in enumerate(lines):
        if ln.strip() and not ln.startswith((" ", "\t")):
            msg = " ".join(x.strip() for x in lines[i:] if x.strip())
            break
    msg = (msg or text.strip() or repr(e))[:800]
    if "ModuleNotFoundError" in msg or "ImportError" in msg:
        msg += (f" (Spark's Python workers cannot import it: set PYSPARK_PYTHON={sys.executable} before the "
                "SparkSession starts, and put this repository on PYTHONPATH; "
                "spark.jobs.common.spark_session does both)")
    return msg


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
) -> str:
    """Write ``df`` into the store ``store`` and return a consistency token.

    - ``key``: the key column; its Spark type picks the format (string, long, int, double, binary).
    - ``value``: one column (a simple format from its type), a list of columns (a JSON record
      whose fields are string/long/int/double/boolean/timestamp), or None for every column
      that is not the key or a window/session time.
    - ``type="window"``: ``window_start`` (timestamp or epoch-ms long column) and
      ``window_size_ms``; ``type="session"``: ``session_start`` and ``session_end`` columns.
    - ``mode="replace"``: keys in the store but not in ``df`` are deleted with tombstones.

    The store is registered in the catalog (its topic created) unless it exists with the same
    definition; anything else raises SinkError before a single record is written. A re-run
    with the same DataFrame leaves the same store. ``progress`` gets one line per step.
    ``registry``: the store types and formats to write by (``federator.plugin.load_plugins()``;
    by default one is loaded for this call).
    """
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    say = progress or (lambda msg: log.info("%s", msg))
    if mode not in MODES:
        raise SinkError(f"mode={mode!r}: use 'upsert' (add and overwrite keys) or 'replace' (also delete missing keys)")
    if not bootstrap_servers or not application_id:
        raise SinkError("pass bootstrap_servers='HOST:PORT' and application_id='APP' (the nodes' application id)")
    registry = registry or load_plugins()
    plan = _plan(
        df, store, key=key, value=value, type=type, partitions=partitions,
        topic=changelog_topic(application_id, store) if isinstance(store, str) else "?",
        window_start=window_start, window_size_ms=window_size_ms,
        session_start=session_start, session_end=session_end, registry=registry,
    )
    catalog = Catalog(bootstrap_servers, application_id, registry)
    # While Spark runs pass 1: read the catalog, and have the driver's producer (catalog record,
    # tombstones) fetch its producer id. Neither writes anything; a definition that does not
    # fit still fails first.
    pool = ThreadPoolExecutor(1)
    store_check = pool.submit(_check_store, catalog, plan.defn)
    warm = pool.submit(_driver_producer, bootstrap_servers)
    pool.shutdown(wait=False)

    started = time.monotonic()
    now_ms = int(time.time() * 1000)  # kv records' time: the write's start
    rows = df.select(*plan.projection, *plan.extra)
    write_columns = [c for c in ("k", "v", "t1", "t2") if c in rows.columns]
    # Pass 1 reads one column: the key hash, null where any check fails (the error path can
    # afford a job of its own to count each check). Pass 2 reads the rows and whether each fails
    # a check (its guard against rows that changed since pass 1), not the hash again.
    fails = functools.reduce(lambda a, b: a | b, [F.coalesce(cond, F.lit(False)) for _, cond in plan.checks])
    key_hash = F.when(fails, F.lit(None)).otherwise(_key_hash(plan.unique_by)).alias("h")
    # Pass 2 computes the rows again unless that costs a shuffle or may give other rows
    # (non-deterministic): then Spark caches them, so both passes see the same rows.
    cached = _costly(rows)
    if cached:
        staged = rows.select(*write_columns, key_hash).persist(StorageLevel.MEMORY_AND_DISK)
        hashes = staged.select("h")
        to_write = staged.select(*write_columns, F.col("h").isNull().alias("bad"))
    else:  # one DataFrame (one plan to analyze) fewer
        hashes = rows.select(key_hash)
        to_write = rows.select(*write_columns, fails.alias("bad"))
    try:
        # ---- pass 1: every check, in Spark; only the key hashes come back ----------------
        try:
            total, failed, maybe_duplicates = _check_rows(hashes)
        except Exception as e:  # a task failed: say why in one line
            store_check.result()
            if e.__class__.__name__ in _SPARK_FAILURES:
                raise RuntimeError(f"checking store {store!r} failed (nothing was written): "
                                   f"{_worker_failure(e)}") from e
            raise
        defn, exists = store_check.result()
        if failed:
            _raise_check_failures(rows, plan, store)
        if maybe_duplicates:
            _raise_duplicates(rows, plan, store)  # a hash collision passes: the exact check finds none
        say(f"{store}: {total} rows checked ({time.monotonic() - started:.1f}s)")

        # ---- register, then write -------------------------------------------------------
        producer = warm.result()
        try:
            catalog.register(defn, producer=producer)
        except CatalogConflict as e:  # another writer registered it meanwhile
            raise SinkError(str(e)) from None
        except BaseException:
            _drop_driver_producer(bootstrap_servers, producer)
            raise
        if not exists:
            say(f"{store}: registered in {catalog.topic} "
                f"({defn.type}, {defn.partitions} partitions, topic {defn.topic})")
        existing = None
        if mode == "replace" and exists:
            existing = _live_keys(bootstrap_servers, defn.topic, defn.partitions, timeout)
            say(f"{store}: {len(existing)} keys in the changelog before the write")
        spark = df.sparkSession
        existing_keys = sorted(existing) if existing else []
        bc = (spark.sparkContext.broadcast({k: i for i, k in enumerate(existing_keys)})
              if existing_keys else None)
        spec = _WriteSpec(
            bootstrap_servers=bootstrap_servers, topic=defn.topic, partitions=defn.partitions,
            layout=defn.store_type.changelog_layout, key_format=defn.key_format, value_format=defn.value_format,
            now_ms=now_ms, producer_config=PRODUCER_CONFIG, flush_timeout=timeout, existing=bc,
        )
        # ---- pass 2: serialize and produce, one Python pass over the rows ----------------
        write_started = time.monotonic()
        try:
            writer = functools.partial(_write_partition, spec)
            with _session_conf(spark, PASS2_ARROW_CONF):
                results = _map_in_arrow(to_write, writer, RESULT_DDL).collect()
        except Exception as e:  # a task failed: say why in one line
            if e.__class__.__name__ in _SPARK_FAILURES:
                raise kafka.KafkaUnavailable(f"writing store {store!r} failed: {_worker_failure(e)}") from e
            raise
        finally:
            if bc is not None:
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
            gone = _unmarked(existing_keys, seen)
            if gone:
                for p, o in _tombstones(bootstrap_servers, defn, gone, now_ms, timeout).items():
                    offsets[p] = max(offsets.get(p, -1), o)
            say(f"{store}: deleted {len(gone)} keys that are no longer in the DataFrame")
    finally:
        if cached:
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
    kf = _field(df, key, "the key")
    if SIMPLE_FORMAT_OF.get(_type_name(kf.dataType)) != defn.key_format:
        raise SinkError(f"key column {key!r} has Spark type {kf.dataType.simpleString()}, but store {store!r} "
                        f"has {defn.key_format} keys")
    times = [_time_column(df, c, "an entry's time") for c in wanted]
    rows = df.select(F.col(f"`{key}`"), *times).collect()
    if not rows:
        return Position().to_token()
    plain = _serialize(pa.array([r[0] for r in rows]), defn.key_format)
    t1, t2 = (pa.array([r[i] for r in rows], pa.int64()) if len(times) >= i else None for i in (1, 2))
    keys = _suffixed(plain, layout, t1, t2).to_pylist()
    offsets = _tombstones(bootstrap_servers, defn, keys, int(time.time() * 1000), timeout)
    return Position({defn.topic: offsets}).to_token()
