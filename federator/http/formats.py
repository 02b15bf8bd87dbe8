"""Response bodies for SQL results: JSON, NDJSON, CSV and Arrow IPC, streamed batch by batch.

Each serializer is a generator of ``bytes`` that converts one record batch at a time, so a
large result is never held whole in memory; the WSGI server sends chunks as they come.

Value conventions (JSON and NDJSON; CSV uses the same text for the same values):

* integers are JSON numbers, exact at any size (int64/uint64 are never turned into floats;
  a JavaScript reader loses precision beyond 2**53, a Python or Java reader does not);
* floats are numbers in shortest round-trip form; NaN and ±infinity, which JSON cannot
  carry, become ``null`` (in CSV an empty field);
* timestamps are ISO-8601 in UTC with a ``Z`` suffix, ``2024-05-01T12:00:00.000Z``, with as
  many fraction digits as the column's unit (none for s, 3 for ms, 6 for us, 9 for ns).
  Naive timestamps are taken to be UTC: Federator's own are epoch milliseconds;
* dates ``YYYY-MM-DD``; times ``HH:MM:SS[.fff]``; durations ISO-8601 (``PT1.5S``);
* decimals are strings, so no digit is lost to a float; those of scale 0 (DuckDB's HUGEINT,
  the type of an integer SUM) are integers, exact as the others;
* binary is standard base64 (with padding); booleans true/false; NULL is ``null``;
* lists are arrays, structs objects, maps arrays of ``[key, value]`` pairs.

CSV: a header line, then one line per row; strings are always quoted, so ``""`` is the
empty string and an empty unquoted field is NULL. Nested values are JSON text.

A failure after the first chunk has been sent can no longer change the HTTP status. JSON
then ends with an ``"error"`` member in place of the token and stats, NDJSON with an
``{"error": ...}`` line. CSV and Arrow have no place for it, so they end with something no
reader takes for data: CSV with a line of one field more than the header,
``"federator_error","CODE: message",...`` (pandas and Arrow's CSV reader refuse a ragged
line; a lenient reader still shows the error as the last row), Arrow with an invalid IPC
message. The body is then also cut off where the
server allows it (waitress and the loop server never end the chunked body; granian does), so no client
takes a short result for a whole one.
"""

from __future__ import annotations

import base64
import datetime as _dt
import io
import json
import logging
import math
import threading
from collections import OrderedDict
from decimal import Decimal
from typing import Any, Callable, Iterable, Iterator, Mapping

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.ipc as pa_ipc

from federator.errors import SqlError, as_error
from federator.http.failure_marks import ARROW_ERROR_MESSAGE, CSV_ERROR_FIELD
from federator.memo import by_identity
from federator.settings import JSON_ROWS, JSON_ROWS_MAX_BYTES
from federator.sql.types import _is, sql_type_name

log = logging.getLogger(__name__)


# Format name -> media type. Names are what the "format" field takes.
MEDIA_TYPES: dict[str, str] = {
    "json": "application/json",
    "ndjson": "application/x-ndjson",
    "csv": "text/csv",
    "arrow": "application/vnd.apache.arrow.stream",
}
DEFAULT_FORMAT = "json"
_BY_MEDIA_TYPE = {m: n for n, m in MEDIA_TYPES.items()}

# Below this many rows per batch, per-value Python beats Arrow kernels: each kernel call
# costs ~10 us of fixed overhead, which would dominate the common one-row answer.
_VECTOR_MIN_ROWS = 32

_EPOCH = _dt.datetime(1970, 1, 1)
_UTC = _dt.timezone.utc
_UNIT_DIGITS = {"s": 0, "ms": 3, "us": 6, "ns": 9}
_UNIT_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}

# JSON is written by orjson, in C: compact UTF-8, floats in shortest round-trip form, and what
# it cannot take through ``jsonable``, as the json module writes it; datetimes and dataclasses
# go there too (orjson would write them its own way), and a NaN that reached it would be null.
# What it refuses (an int past 64 bits, a map's non-string keys) the json module writes.
_ORJSON_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
_encoder = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False, check_circular=False,
                            default=lambda o: jsonable(o))


def _encode(value: Any) -> bytes:
    """``value`` as JSON in UTF-8, as the body takes it (not made text and encoded again)."""
    try:
        return orjson.dumps(value, default=jsonable, option=_ORJSON_OPTIONS)
    except TypeError:  # orjson.JSONEncodeError
        return _encoder.encode(value).encode()


Converter = Callable[[pa.Array], list]


def choose_format(requested: Any, accept: Any) -> str:
    """The format name: the body's "format" field, else the Accept header, else JSON.

    ``requested`` may be a name or a media type; ``accept`` is Werkzeug's MIMEAccept. An
    Accept header that names nothing we serve (a browser's text/html) falls back to JSON.
    """
    if requested is not None:
        if isinstance(requested, str):
            key = requested.strip().lower()
            name = key if key in MEDIA_TYPES else _BY_MEDIA_TYPE.get(key)
            if name:
                return name
        valid = ", ".join(MEDIA_TYPES)
        raise SqlError("INVALID_PARAMETER", f"field 'format' must be one of {valid} (or their media types), got {requested!r}")
    if accept:
        best = accept.best_match(list(_BY_MEDIA_TYPE), default=None)
        if best:
            return _BY_MEDIA_TYPE[best]
    return DEFAULT_FORMAT


# --- Python values ---------------------------------------------------------------------


def jsonable(v: Any) -> Any:
    """A Python value (from to_pylist, or a node's lookup row) in the conventions above."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, _dt.datetime):
        return _iso_datetime(v)
    if isinstance(v, (_dt.date, _dt.time)):
        return v.isoformat()
    if isinstance(v, _dt.timedelta):
        return _iso_duration(v)
    if isinstance(v, (bytes, bytearray, memoryview)):
        return base64.b64encode(v).decode("ascii")
    if isinstance(v, Decimal):
        return int(v) if v == v.to_integral_value() and v.as_tuple().exponent == 0 else str(v)
    if isinstance(v, Mapping):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, pa.Scalar):
        return jsonable(v.as_py())
    return str(v)


def _iso_datetime(d: _dt.datetime) -> str:
    if d.tzinfo is not None:
        d = d.astimezone(_UTC).replace(tzinfo=None)
    return d.isoformat() + "Z"


def _iso_duration(td: _dt.timedelta) -> str:
    us = td // _dt.timedelta(microseconds=1)
    sign, us = ("-", -us) if us < 0 else ("", us)
    secs, frac = divmod(us, 1_000_000)
    return f"{sign}PT{secs}.{frac:06d}".rstrip("0").rstrip(".") + "S"


# --- per-column converters to lists of JSON-ready values ----------------------------------


def _plain(col: pa.Array) -> list:
    return col.to_pylist()


def _floats(col: pa.Array) -> list:
    vals = col.to_pylist()
    # A sum that is finite proves every term is (NaN and inf propagate); filter(None) drops
    # nulls and zeros, which are finite anyway. So the per-value check runs only when needed.
    if math.isfinite(sum(filter(None, vals))):
        return vals
    return [v if v is None or math.isfinite(v) else None for v in vals]


def _timestamp_converter(unit: str) -> Converter:
    digits, per_second = _UNIT_DIGITS[unit], _UNIT_PER_SECOND[unit]
    naive = pa.timestamp(unit)

    def small(col: pa.Array) -> list:
        out: list = []
        append = out.append
        for v in col.view(_INT64).to_pylist():
            if v is None:
                append(None)
                continue
            secs, frac = divmod(v, per_second)
            text = (_EPOCH + _dt.timedelta(seconds=secs)).isoformat()
            append(f"{text}.{frac:0{digits}d}Z" if digits else text + "Z")
        return out

    def vectorized(col: pa.Array) -> list:
        # The int64 values are UTC instants whatever the zone; viewing them as a naive
        # timestamp formats them in UTC without consulting a time zone database.
        text = col.view(_INT64).view(naive).cast(pa.string())
        text = pc.replace_substring(text, " ", "T", max_replacements=1)
        return pc.binary_join_element_wise(text, "Z", "").to_pylist()

    def convert(col: pa.Array) -> list:
        if len(col) >= _VECTOR_MIN_ROWS:
            return vectorized(col)
        try:
            return small(col)
        except OverflowError:  # beyond datetime's years 1..9999; Arrow still writes something
            return vectorized(col)

    return convert


_INT64 = pa.int64()


def _dates(col: pa.Array) -> list:
    if len(col) >= _VECTOR_MIN_ROWS:
        return col.cast(pa.date32()).cast(pa.string()).to_pylist()
    return [None if d is None else d.isoformat() for d in col.to_pylist()]


def _as_text(col: pa.Array) -> list:
    return col.cast(pa.string()).to_pylist()


def _binary(col: pa.Array) -> list:
    b64 = base64.b64encode
    return [None if v is None else b64(v).decode("ascii") for v in col.to_pylist()]


def _nested(col: pa.Array) -> list:
    return [jsonable(v) for v in col.to_pylist()]


def converter_for(t: pa.DataType) -> Converter:
    """How to turn a column of type ``t`` into a list of JSON-ready Python values."""
    if pa.types.is_dictionary(t):
        inner = converter_for(t.value_type)
        return lambda col: inner(col.dictionary_decode())
    if isinstance(t, pa.ExtensionType):
        inner = converter_for(t.storage_type)
        return lambda col: inner(col.storage)
    if pa.types.is_floating(t):
        return _floats
    if pa.types.is_timestamp(t):
        return _timestamp_converter(t.unit)
    if pa.types.is_date(t):
        return _dates
    if pa.types.is_decimal(t) and t.scale == 0:
        return _whole_decimals
    if pa.types.is_time(t) or pa.types.is_decimal(t):
        return _as_text
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t) or _is(t, "is_binary_view"):
        return _binary
    if (pa.types.is_integer(t) or pa.types.is_boolean(t) or pa.types.is_string(t) or pa.types.is_large_string(t)
            or _is(t, "is_string_view") or pa.types.is_null(t)):
        return _plain
    return _nested  # lists, structs, maps, durations, intervals


def _whole_decimals(col: pa.Array) -> list:
    return [None if v is None else int(v) for v in col.to_pylist()]


def _finite(v: Any) -> Any:
    return v if v is None or math.isfinite(v) else None


def _timestamp_value(unit: str) -> Callable[[Any], Any]:
    digits, per_second = _UNIT_DIGITS[unit], _UNIT_PER_SECOND[unit]

    def convert(v: Any) -> Any:
        if v is None:
            return None
        secs, frac = divmod(v, per_second)
        text = (_EPOCH + _dt.timedelta(seconds=secs)).isoformat()
        return f"{text}.{frac:0{digits}d}Z" if digits else text + "Z"

    return convert


def _base64(v: Any) -> Any:
    return None if v is None else base64.b64encode(v).decode("ascii")


def _same(v: Any) -> Any:
    return v


def value_converter_for(t: pa.DataType) -> Callable[[Any], Any] | None:
    """``converter_for`` for one Python value as a row holds it (a timestamp as an integer
    count of its unit since the epoch); None for types only Arrow columns convert."""
    if pa.types.is_floating(t):
        return _finite
    if pa.types.is_timestamp(t):
        return _timestamp_value(t.unit)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return _base64
    if pa.types.is_integer(t) or pa.types.is_boolean(t) or pa.types.is_string(t) or pa.types.is_large_string(t):
        return _same
    return None


@by_identity
def _row_layout(schema: pa.Schema) -> list[Callable[[Any], Any]] | None:
    converters = [value_converter_for(f.type) for f in schema]
    return None if any(c is None for c in converters) else converters  # type: ignore[return-value]


def json_rows_body(schema: pa.Schema, rows: list[tuple], trailer: Mapping[str, Any]) -> bytes | None:
    """The JSON answer straight from Python rows (point lookups), exactly as ``json_chunks``
    writes it from Arrow; None when a column's type needs the Arrow path."""
    converters = _row_layout(schema)
    if converters is None:
        return None
    out = [[conv(v) for conv, v in zip(converters, row)] for row in rows]
    body = _encode({"rows": out, **trailer})
    return b'{"columns":' + _layout(schema)[1] + b"," + body[1:]


def json_object_body(schema: pa.Schema, row: tuple) -> bytes | None:
    """One row as a JSON object of column: value (the REST key lookup), from Python values as
    ``json_rows_body`` takes them; None when a column's type needs the Arrow path."""
    converters = _row_layout(schema)
    if converters is None:
        return None
    return _encode({f.name: conv(v) for f, conv, v in zip(schema, converters, row)})


def json_object_from_arrow(batch: pa.RecordBatch) -> bytes:
    """The first row of ``batch`` as a JSON object, written as ``json_chunks`` writes a row."""
    converters = _layout(batch.schema)[0]
    first = batch.slice(0, 1)
    return _encode({f.name: conv(col)[0] for f, conv, col in zip(batch.schema, converters, first.columns)})


@by_identity
def _layout(schema: pa.Schema) -> tuple[list[Converter], bytes]:
    """Converters and the JSON "columns" array per schema; made once, because building them
    costs as much as the rest of a one-row answer."""
    columns = [{"name": f.name, "type": sql_type_name(f.type)} for f in schema]
    return [converter_for(f.type) for f in schema], _encode(columns)


def _columns(batch: pa.RecordBatch, converters: list[Converter]) -> list[list]:
    return [conv(col) for conv, col in zip(converters, batch.columns)]


# The JSON rows of kept answers' batches (the engine gives the same batch objects again while
# the answer is unchanged): a repeated leaderboard or dashboard statement then costs no encoding.
# Each entry holds its batch, so the id names it while remembered.
_ROWS_JSON: OrderedDict[int, tuple[pa.RecordBatch, bytes]] = OrderedDict()
_ROWS_JSON_LOCK = threading.Lock()


def _rows_json(batch: pa.RecordBatch, converters: list[Converter], remember: bool) -> bytes:
    """``batch``'s rows as a JSON list: one encode call, the C encoder doing every row tuple."""
    if remember:
        with _ROWS_JSON_LOCK:
            hit = _ROWS_JSON.get(id(batch))
        if hit is not None and hit[0] is batch:
            return hit[1]
    rows = _encode(list(zip(*_columns(batch, converters))))
    if remember and len(rows) <= JSON_ROWS_MAX_BYTES:
        with _ROWS_JSON_LOCK:
            _ROWS_JSON[id(batch)] = (batch, rows)
            while len(_ROWS_JSON) > JSON_ROWS:
                _ROWS_JSON.popitem(last=False)
    return rows


def error_body(e: BaseException) -> dict:
    """The ``{"error": ...}`` object for an exception raised while streaming."""
    return as_error(e).to_dict()


# --- the four formats -----------------------------------------------------------------------


def json_chunks(schema: pa.Schema, batches: Iterable[pa.RecordBatch], trailer: Callable[[], Mapping[str, Any]],
                kept: bool = False) -> Iterator[bytes]:
    """``{"columns": [...], "rows": [...], <trailer>}``; the trailer is read after the last row.

    The trailer comes last because the engine fills in the row count and elapsed time
    only as the batches are consumed. ``kept``: the batches are a kept answer's, given again
    while unchanged: their rows' JSON is remembered (``_rows_json``).
    """
    converters, columns = _layout(schema)
    yield b'{"columns":' + columns + b',"rows":['
    sep = b""
    try:
        for batch in batches:
            if batch.num_rows:
                rows = _rows_json(batch, converters, kept)
                yield sep + rows[1:-1]
                sep = b","
        tail = _encode(dict(trailer()))
    except Exception as e:  # the status is sent already: say so in the body (see module doc)
        log.warning("SQL result failed while streaming JSON: %s", e, exc_info=not isinstance(e, SqlError))
        tail = _encode(error_body(e))
    yield b"]," + tail[1:] if tail != b"{}" else b"]}"


def ndjson_chunks(schema: pa.Schema, batches: Iterable[pa.RecordBatch]) -> Iterator[bytes]:
    """One JSON object per row keyed by column name (a repeated name keeps its last value)."""
    converters = _layout(schema)[0]
    names = schema.names
    try:
        for batch in batches:
            if batch.num_rows:
                lines = [_encode(dict(zip(names, row))) for row in zip(*_columns(batch, converters))]
                lines.append(b"")
                yield b"\n".join(lines)
    except Exception as e:
        log.warning("SQL result failed while streaming NDJSON: %s", e, exc_info=not isinstance(e, SqlError))
        yield _encode(error_body(e)) + b"\n"


def _csv_column(field: pa.Field, col: pa.Array, conv: Converter) -> pa.Array:
    """The column as Arrow's CSV writer should see it, so its text follows our conventions."""
    t = field.type
    if pa.types.is_dictionary(t):
        return _csv_column(pa.field(field.name, t.value_type), col.dictionary_decode(), converter_for(t.value_type))
    if isinstance(t, pa.ExtensionType):
        return _csv_column(pa.field(field.name, t.storage_type), col.storage, converter_for(t.storage_type))
    if pa.types.is_floating(t):
        return pa.array(conv(col), type=t)  # NaN/inf -> null, not Arrow's "nan"/"inf"
    if conv is _plain or conv is _as_text or pa.types.is_date(t):
        return col  # Arrow writes these exactly as JSON does
    if conv is _nested:
        return pa.array([None if v is None else (v if isinstance(v, str) else _encode(v).decode()) for v in conv(col)], pa.string())
    return pa.array(conv(col), pa.string())  # timestamps, binary


def csv_error_line(e: BaseException, columns: int) -> bytes:
    err = error_body(e)["error"]
    text = f"{err['code']}: {err['message']}".replace('"', '""')
    return CSV_ERROR_FIELD + f'"{text}"'.encode() + b"," * (columns - 1) + b"\n"


def csv_chunks(schema: pa.Schema, batches: Iterable[pa.RecordBatch]) -> Iterator[bytes]:
    try:
        yield from _csv_chunks(schema, batches)
    except Exception as e:
        log.warning("SQL result failed while streaming CSV: %s", e, exc_info=not isinstance(e, SqlError))
        yield csv_error_line(e, len(schema))
        raise


def _csv_chunks(schema: pa.Schema, batches: Iterable[pa.RecordBatch]) -> Iterator[bytes]:
    converters = [converter_for(f.type) for f in schema]
    sink = io.BytesIO()
    writer: pa_csv.CSVWriter | None = None
    for batch in batches:
        arrays = [_csv_column(f, col, conv) for f, col, conv in zip(schema, batch.columns, converters)]
        out = pa.RecordBatch.from_arrays(arrays, names=schema.names)
        if writer is None:  # the header needs the converted schema, known at the first batch
            writer = pa_csv.CSVWriter(sink, out.schema)
        writer.write_batch(out)
        yield _drain(sink)
    if writer is None:  # no batches at all: still write the header
        empty = [_csv_column(f, pa.array([], f.type), conv) for f, conv in zip(schema, converters)]
        writer = pa_csv.CSVWriter(sink, pa.RecordBatch.from_arrays(empty, names=schema.names).schema)
    writer.close()
    if tail := _drain(sink):
        yield tail


# An Arrow answer's batches are written as IPC messages of about this size at most: each
# message is copied into the body chunk the server sends, and the server copies it again,
# so a whole partition's batch per message held several copies of it at once.
ARROW_MESSAGE_BYTES = 1 << 18


def arrow_chunks(schema: pa.Schema, batches: Iterable[pa.RecordBatch]) -> Iterator[bytes]:
    """The Arrow IPC stream format: schema, each batch as it comes (a large one as several
    messages of consecutive rows), end-of-stream marker."""
    sink = io.BytesIO()
    writer = pa_ipc.new_stream(sink, schema)
    yield _drain(sink)
    try:
        for batch in batches:
            for piece in _pieces(batch, ARROW_MESSAGE_BYTES):
                writer.write_batch(piece)
                yield _drain(sink)
    except Exception as e:
        log.warning("SQL result failed while streaming Arrow: %s", e, exc_info=not isinstance(e, SqlError))
        yield _drain(sink) + ARROW_ERROR_MESSAGE
        raise
    writer.close()
    if tail := _drain(sink):
        yield tail


def _pieces(batch: pa.RecordBatch, max_bytes: int) -> Iterator[pa.RecordBatch]:
    """``batch`` as slices (no copies) of about ``max_bytes`` or less, its rows in order."""
    size, n = batch.nbytes, batch.num_rows
    if size <= max_bytes or n <= 1:
        yield batch
        return
    rows = max(1, n * max_bytes // size)
    for start in range(0, n, rows):
        yield batch.slice(start, rows)


def _drain(sink: io.BytesIO) -> bytes:
    data = sink.getvalue()
    sink.seek(0)
    sink.truncate()
    return data


def body_chunks(fmt: str, schema: pa.Schema, batches: Iterable[pa.RecordBatch],
                trailer: Callable[[], Mapping[str, Any]], kept: bool = False) -> Iterator[bytes]:
    """The response body in format ``fmt`` (a key of MEDIA_TYPES). ``kept``: the batches are
    an answer the engine keeps and gives again (its JSON rows are then kept too)."""
    if fmt == "json":
        return json_chunks(schema, batches, trailer, kept)
    if fmt == "ndjson":
        return ndjson_chunks(schema, batches)
    if fmt == "csv":
        return csv_chunks(schema, batches)
    if fmt == "arrow":
        return arrow_chunks(schema, batches)
    raise ValueError(f"unknown format {fmt!r}")
