"""Planning a write (driver side, before any job runs): from the DataFrame's schema and the
arguments, the store definition, the columns the writer reads, and the row checks pass 1 runs.
Spark types pick the formats here; anything that cannot be written raises SinkError."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from federator.catalog import DefinitionError, StoreDefinition
from federator.catalog.definition import RESERVED_COLUMNS
from federator.plugin import Registry
from federator_spark.sink.errors import SinkError

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


def type_name(dtype: Any) -> str:
    return type(dtype).__name__


def _cast_hint(col: str, dtype: Any, allowed: str) -> str:
    hint = _CAST_HINT.get(type_name(dtype))
    cast = f"; cast it first, e.g. F.col({col!r}).cast({hint.split()[0]!r})" if hint else ""
    return f"use one of: {allowed}{cast}"


@dataclass
class Plan:
    defn: StoreDefinition
    projection: list[Any]  # Spark columns k, v, [t1, [t2]]: what the writer reads
    extra: list[Any]  # more columns that only the checks read
    checks: list[tuple[str, Any]]  # (message if {n} rows fail, row condition over projection + extra)
    unique_by: list[str]  # projection columns that identify a changelog key
    key_label: str
    value_encoded: bool  # v holds its bytes already (a JSON document built by Spark's to_json)


def field(df: Any, name: Any, role: str) -> Any:
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


def time_column(df: Any, name: Any, role: str) -> Any:
    """A window/session time column as epoch milliseconds (long)."""
    from pyspark.sql import functions as F

    f = field(df, name, role)
    t = type_name(f.dataType)
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


@dataclass
class Shape:
    """What a write's schema and arguments make: the store definition and which columns hold
    the key, the value and the window/session times. Needs no Spark session (the data source's
    writer plans in a Python worker that has none)."""

    defn: StoreDefinition
    layout: str
    key: str
    value: str | list[str]  # one column, or the JSON record's columns
    window_start: str | None
    session_start: str | None
    session_end: str | None

    @property
    def times(self) -> list[str]:
        return [c for c in (self.window_start, self.session_start, self.session_end) if c is not None]


class Columns:
    """A schema as field() reads a DataFrame (its fields and column names)."""

    def __init__(self, schema: Any) -> None:
        self.schema = schema
        self.columns = [f.name for f in schema.fields]


def time_type(df: Any, name: Any, role: str) -> str:
    """A window/session time column's Spark type: a timestamp or a long of epoch milliseconds."""
    f = field(df, name, role)
    t = type_name(f.dataType)
    if t not in ("TimestampType", "LongType"):
        raise SinkError(
            f"column {name!r} ({role}) has Spark type {f.dataType.simpleString()}; it must be a timestamp or a long "
            f"of epoch milliseconds: convert it first, e.g. F.col({name!r}).cast('timestamp') or F.unix_millis(...)"
        )
    return t


def shape(
    df: Any, store: str, *, key: Any, value: Any, type: str, partitions: int, topic: str,
    window_start: Any, window_size_ms: Any, session_start: Any, session_end: Any, registry: Registry,
    global_store: bool = False,
) -> Shape:
    """The store a write of ``df``'s columns (a DataFrame, or ``Columns(schema)``) makes; raises
    SinkError naming what does not fit."""
    layout = changelog_layout(registry, type)
    if not isinstance(global_store, bool):
        raise SinkError(f"global_store={global_store!r}: pass True (every node keeps every partition) or False")
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

    kf = field(df, key, "the key")
    key_format = SIMPLE_FORMAT_OF.get(type_name(kf.dataType))
    if key_format is None:
        raise SinkError(
            f"key column {key!r} has Spark type {kf.dataType.simpleString()}, which no key format fits; "
            + _cast_hint(key, kf.dataType, "string, long, int, double, binary")
        )
    if layout == "window":
        time_type(df, window_start, "the window start")
    elif layout == "session":
        time_type(df, session_start, "the session start")
        time_type(df, session_end, "the session end")
    time_cols = [c for c in (window_start, session_start, session_end) if c is not None]
    value, value_format, value_fields, value_name = _value_shape(df, key, value, time_cols)
    try:
        defn = StoreDefinition(
            name=store, type=type, topic=topic, partitions=partitions, key_format=key_format, key_name=key,
            value_format=value_format, value_name=value_name, value_fields=value_fields,
            window_size_ms=window_size_ms if layout == "window" else None, is_global=global_store, types=registry,
        )
    except DefinitionError as e:
        raise SinkError(f"{e}; rename the column in the DataFrame (withColumnRenamed) "
                        "or pick another store name") from None
    return Shape(defn, layout, key, value, window_start, session_start, session_end)


def _value_shape(df: Any, key: str, value: Any,
                 time_cols: list[str]) -> tuple[Any, str, tuple[tuple[str, str], ...], str]:
    """The value a write of ``df`` stores: (its column or columns, its format, its JSON fields, its
    name); ``value`` None takes every column but the key and the times. Raises SinkError naming
    a column no format fits."""
    if value is None:  # every other column
        value = [c for c in df.columns
                 if c != key and c not in time_cols and c.lower() not in RESERVED_COLUMNS]
        if not value:
            raise SinkError(f"the DataFrame has no value column besides the key {key!r}; "
                            "pass value=COLUMN or value=[COLUMNS]")
        if len(value) == 1:
            value = value[0]
    if isinstance(value, str):
        vf = field(df, value, "the value")
        value_format = SIMPLE_FORMAT_OF.get(type_name(vf.dataType))
        if value_format is None:
            allowed = "string, long, int, double, binary (or pass value=[columns] for a JSON record)"
            raise SinkError(f"value column {value!r} has Spark type {vf.dataType.simpleString()}, which no value "
                            f"format fits; " + _cast_hint(value, vf.dataType, allowed))
        value_fields: tuple[tuple[str, str], ...] = ()
        value_name = value
    elif isinstance(value, (list, tuple)) and value:
        if len(set(value)) != len(value):
            raise SinkError(f"value lists a column twice: {list(value)!r}")
        fields = []
        for name in value:
            vf = field(df, name, "a value field")
            ftype = JSON_FIELD_OF.get(type_name(vf.dataType))
            if ftype is None:
                raise SinkError(
                    f"value column {name!r} has Spark type {vf.dataType.simpleString()}, which no JSON field type "
                    f"fits; " + _cast_hint(name, vf.dataType, "string, long, int, double, boolean, timestamp")
                )
            fields.append((name, ftype))
        value = list(value)
        value_format, value_fields, value_name = "json", tuple(fields), "value"
    else:
        raise SinkError(f"value must be a column name, a non-empty list of column names, or None; got {value!r}")
    return value, value_format, value_fields, value_name


def plan(
    df: Any, store: str, *, key: Any, value: Any, type: str, partitions: int, topic: str,
    window_start: Any, window_size_ms: Any, session_start: Any, session_end: Any, registry: Registry,
    global_store: bool = False,
) -> Plan:
    from pyspark.sql import functions as F

    s = shape(df, store, key=key, value=value, type=type, partitions=partitions, topic=topic,
              window_start=window_start, window_size_ms=window_size_ms, session_start=session_start,
              session_end=session_end, registry=registry, global_store=global_store)
    defn, layout, value = s.defn, s.layout, s.value
    col = lambda name: F.col(f"`{name}`")  # noqa: E731  (names may hold dots)
    checks: list[tuple[str, Any]] = []
    extra: list[Any] = []  # projected only for the checks
    checks.append((f"key column {key!r} has {{n}} null values; a store key cannot be null: "
                   f"filter them out (df.where(F.col({key!r}).isNotNull())) or fill them", F.col("k").isNull()))
    if isinstance(value, str):
        value_expr = col(value)
        checks.append((f"value column {value!r} has {{n}} null values; a null value would delete its key: "
                       f"filter them out or fill them (df.fillna)", F.col("v").isNull()))
    else:
        parts = []
        for name, ftype in defn.value_fields:
            parts.append((F.unix_millis(col(name)) if ftype == "timestamp" else col(name)).alias(name))
            if ftype == "double":
                flag = f"x{len(extra)}"
                extra.append((F.isnan(col(name)) | (F.abs(col(name)) == float("inf"))).alias(flag))
                checks.append((f"value column {name!r} has {{n}} NaN or infinite values, which JSON cannot hold: "
                               f"replace them (e.g. F.nanvl) or write the column as a simple double value",
                               F.col(flag)))
        # The JSON document is built by Spark, next to the data: the writer produces its bytes as
        # they are. They decode to what the json format's serialize gives, but are not always the
        # same bytes (Spark writes non-ASCII as UTF-8 and doubles as Java prints them).
        value_expr = F.to_json(F.struct(*parts), {"ignoreNullFields": "false"})

    projection = [col(key).alias("k"), value_expr.alias("v")]
    unique_by = ["k"]
    if layout == "window":
        t1 = time_column(df, window_start, "the window start")
        projection.append(t1.alias("t1"))
        unique_by.append("t1")
        t1 = F.col("t1")
        checks.append((f"window start column {window_start!r} has {{n}} null values; every window needs its start",
                       t1.isNull()))
        checks.append((f"window start column {window_start!r} has {{n}} values before 1970-01-01; window starts are "
                       f"non-negative epoch milliseconds", t1 < 0))
    elif layout == "session":
        t1 = time_column(df, session_start, "the session start")
        t2 = time_column(df, session_end, "the session end")
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

    what = {"kv": "key", "window": "key and window start", "session": "key and session start/end"}[layout]
    label = f"{what} ({', '.join(repr(c) for c in [key, *s.times])})"
    return Plan(defn, projection, extra, checks, unique_by, label, value_encoded=defn.value_format == "json")
