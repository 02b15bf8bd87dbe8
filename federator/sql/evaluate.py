"""Scalar SQL expressions (sqlglot trees) compiled into vectorized Arrow evaluators.

Everything after the storage lookup runs on Arrow, and every answer must equal DuckDB's for
the same SQL over the same rows, so this module follows DuckDB 2 where Arrow's kernels differ:

* `/` is float division even on integers (x/0 gives ±inf or NaN); `//` and `%` on integers
  truncate toward zero and raise on a zero divisor, as DuckDB does. `//` on a DOUBLE is plain
  division. Integer `+ - * // %` are overflow-checked and yield BIGINT (int64).
* NaN equals NaN and sorts above every other DOUBLE in comparisons, IN and BETWEEN.
* CASE and COALESCE evaluate a branch only on the rows that reach it, so
  `CASE WHEN b <> 0 THEN a % b END` never divides by zero (AND/OR evaluate both sides, as in
  DuckDB). Constants are folded at compile time as DuckDB's optimizer folds them: an operator
  with a NULL operand is NULL, x AND FALSE is FALSE, x OR TRUE is TRUE, and a WHEN with a
  constant condition is decided, without evaluating (or failing on) the other operands.
* A string literal (or a str parameter) next to a typed operand is cast to that type, and in
  comparisons a VARCHAR column is cast to the other side's type, as DuckDB binds them.
* Decimal literals such as 1.5 are DOUBLE here (DuckDB: DECIMAL); values agree to float
  precision, but DECIMAL-only behaviour (0.5 % 0 raising, exact 0.1 + 0.2) is not copied.
  Integer operands are widened to BIGINT, so an INTEGER overflow DuckDB reports is a value
  here; 'infinity' dates and timestamps, which Arrow cannot hold, are NULL. A naive TIMESTAMP
  next to a TIMESTAMP WITH TIME ZONE is read as UTC (DuckDB uses its TimeZone setting;
  Federator's reference setting is UTC). Hex strings ('0x10') do not CAST to integers here.
* CASTs follow DuckDB's parsers and formatters: DOUBLE -> VARCHAR as the shortest round trip
  ('1.0', '1e+20'), DOUBLE -> INTEGER rounds half to even, VARCHAR -> INTEGER accepts
  '1_000', ' 12 ', '1.5' (-> 2), '1e2'; timestamps print as '2024-01-02 03:04:05.5+00'.

Errors are SqlError: unknown columns (UNKNOWN_COLUMN), missing parameters
(INVALID_PARAMETER), constructs or type combinations not handled here (UNSUPPORTED, naming
the construct with its SQL) and failures that depend on the rows, such as division by zero,
overflow or a failed CAST (DATA_ERROR_CODE).
"""

from __future__ import annotations

import datetime as dt
import decimal
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from federator.sql.types import sql_type_name
from federator.sql.errors import SqlError, unsupported

# errors.py has no code for "the rows made this expression fail" (DuckDB's Conversion and
# Out of Range errors); 422 is the closest existing one. Change it here if a code is added.
DATA_ERROR_CODE = "INVALID_DATA"

Value = pa.Array | pa.Scalar
Rows = pa.Table | pa.RecordBatch

__all__ = ["Compiled", "compile_expr", "default_name", "number_params", "DATA_ERROR_CODE"]


# --------------------------------------------------------------------------- rows


class _Rows:
    """The columns of the batch under evaluation, or of a subset of its rows.

    Subsets exist so CASE/COALESCE branches run only on the rows that reach them; columns are
    taken lazily so a branch pays only for the columns it reads."""

    __slots__ = ("_source", "_parent", "_take", "_cache", "n")

    def __init__(self, source: Rows | None, n: int, parent: _Rows | None = None, take: pa.Array | None = None):
        self._source, self._parent, self._take, self.n = source, parent, take, n
        self._cache: dict[str, pa.Array] = {}

    def column(self, name: str) -> pa.Array:
        col = self._cache.get(name)
        if col is None:
            if self._parent is not None:
                col = self._parent.column(name).take(self._take)
            else:
                col = self._source.column(name)
                if isinstance(col, pa.ChunkedArray):
                    col = col.combine_chunks()
            self._cache[name] = col
        return col

    def subset(self, indices: pa.Array) -> _Rows:
        return _Rows(None, len(indices), self, indices)


def _arange(n: int) -> pa.Array:
    return pc.indices_nonzero(pa.repeat(pa.scalar(True), n))


def _as_array(v: Value, n: int, type_: pa.DataType) -> pa.Array:
    if isinstance(v, pa.Scalar):
        v = pa.nulls(n, type_) if not v.is_valid else pa.repeat(v.cast(type_), n)
    elif isinstance(v, pa.ChunkedArray):
        v = v.combine_chunks()
    return v if v.type == type_ else v.cast(type_)


# --------------------------------------------------------------------------- compiled


@dataclass(frozen=True, eq=False)
class Compiled:
    """An expression ready to run: `.type` is known before any data; calling it with a table
    or record batch returns one value per row (constants are broadcast)."""

    type: pa.DataType
    fn: Callable[[_Rows], Value] = field(repr=False)
    sql: str = ""
    const: bool = False  # reads no column: the same value on every row
    literal_string: bool = False  # a string literal or str parameter: takes its neighbour's type
    null: bool = False  # the constant NULL
    known: pa.Scalar | None = field(default=None, repr=False)  # the value, when folded at compile time

    def __call__(self, table: Rows) -> pa.Array:
        rows = _Rows(table, table.num_rows)
        try:
            return _as_array(self.fn(rows), rows.n, self.type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
            # Kernels that can fail on data are guarded where they run; this is the backstop
            # that keeps a Python traceback from reaching a user.
            raise SqlError(DATA_ERROR_CODE, f"cannot evaluate {self.sql}: {e}") from e

    def eval(self, rows: _Rows) -> Value:
        return self.fn(rows)

    def value(self) -> Any:
        """The Python value of a constant expression (evaluated at compile time, on no data)."""
        v = self.fn(_Rows(None, 1))
        return (v if isinstance(v, pa.Scalar) else v[0]).as_py()


def _const(scalar: pa.Scalar, sql: str, literal_string: bool = False) -> Compiled:
    return Compiled(scalar.type, lambda rows: scalar, sql, const=True, literal_string=literal_string,
                    null=not scalar.is_valid, known=scalar)


def _fold(c: Compiled) -> Compiled:
    """Evaluate a constant expression at compile time, as DuckDB's constant folding does, so a
    NULL, FALSE or TRUE constant can decide the operators around it without their other
    operands being evaluated. One that fails (1 // 0) is left to fail if it is ever evaluated."""
    if not c.const or c.known is not None:
        return c
    try:
        v = c.fn(_Rows(None, 1))
    except (SqlError, pa.ArrowException):
        return c
    return _const(v if isinstance(v, pa.Scalar) else v[0], c.sql)


def _is(c: Compiled, value: bool) -> bool:
    """Whether `c` is known at compile time to be `value` (TRUE/FALSE; NULL is neither)."""
    return c.known is not None and c.known.is_valid and c.known.as_py() is value


def _derive(type_: pa.DataType, fn: Callable[[_Rows], Value], node: exp.Expression, *parts: Compiled) -> Compiled:
    return Compiled(type_, fn, node.sql(dialect="duckdb"), const=all(p.const for p in parts))


def _strict(type_: pa.DataType, fn: Callable[[_Rows], Value], node: exp.Expression, *parts: Compiled) -> Compiled:
    """_derive for operators that are NULL when an operand is: DuckDB folds them to NULL when an
    operand is the constant NULL, so the other operands are never evaluated (and never fail)."""
    if any(p.null for p in parts):
        return _const(pa.scalar(None, type_), node.sql(dialect="duckdb"))
    return _derive(type_, fn, node, *parts)


def _guard(sql: str, f: Callable[..., Value], *args: Any, **kwargs: Any) -> Value:
    """Run a kernel that can fail on the data and say which expression failed, as DuckDB does."""
    try:
        return f(*args, **kwargs)
    except pa.ArrowInvalid as e:
        msg = str(e).lower()
        what = str(e)
        if "divide by zero" in msg:
            what = "division by zero"
        elif "overflow" in msg:
            what = "integer overflow"
        raise SqlError(DATA_ERROR_CODE, f"{what} in {sql}") from e


# --------------------------------------------------------------------------- types


def _kind(t: pa.DataType) -> str:
    if pa.types.is_null(t):
        return "null"
    if pa.types.is_boolean(t):
        return "bool"
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_timestamp(t):
        return "timestamp"
    if pa.types.is_date(t):
        return "date"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "binary"
    return "other"


_NUMERIC = {"int", "float"}
_INT_TYPES = {8: pa.int8(), 16: pa.int16(), 32: pa.int32(), 64: pa.int64()}


def _unify(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    """The type two operands meet at without touching strings, or None."""
    ka, kb = _kind(a), _kind(b)
    if a == b:
        return a
    if ka == "null":
        return b
    if kb == "null":
        return a
    if ka == kb == "int":
        if pa.types.is_signed_integer(a) and pa.types.is_signed_integer(b):
            return _INT_TYPES[max(a.bit_width, b.bit_width)]
        return pa.int64()
    if ka in _NUMERIC and kb in _NUMERIC:
        return pa.float64()
    if ka == kb == "string":
        return pa.string()
    if ka == kb == "timestamp":
        order = ["s", "ms", "us", "ns"]
        unit = max(a.unit, b.unit, key=order.index)
        return pa.timestamp(unit, "UTC" if (a.tz or b.tz) else None)
    if {ka, kb} == {"timestamp", "date"}:
        return a if ka == "timestamp" else b
    return None


def _common(items: Sequence[Compiled], node: exp.Expression, *, columns_adapt: bool) -> pa.DataType:
    """The type DuckDB binds operands to: string literals take the others' type; with
    `columns_adapt` (comparisons, IN) a VARCHAR column is cast to the other side's type too."""
    t: pa.DataType = pa.null()
    for item in items:
        if item.literal_string:
            continue
        u = _unify(t, item.type)
        if u is None and columns_adapt and "string" in (_kind(t), _kind(item.type)):
            u = item.type if _kind(t) == "string" else t
        if u is None:
            raise unsupported(
                f"combining {sql_type_name(t)} with {sql_type_name(item.type)} in {node.sql(dialect='duckdb')}",
                "add an explicit CAST",
            )
        t = u
    if any(i.literal_string for i in items):
        if _kind(t) == "timestamp" and t.unit in ("s", "ms"):
            t = pa.timestamp("us", t.tz)  # compare with the literal at DuckDB's precision
        if _kind(t) == "null":
            t = pa.string()
        elif not _can_cast(pa.string(), t):
            raise unsupported(f"comparing {sql_type_name(t)} with a string in {node.sql(dialect='duckdb')}")
    return t


def _comparable(t: pa.DataType) -> pa.DataType:
    return pa.int64() if _kind(t) == "null" else t  # NULL = NULL: Arrow has no comparisons on its null type


def _coerce(c: Compiled, t: pa.DataType) -> Compiled:
    if c.type == t:
        return c
    if c.null:
        return _const(pa.scalar(None, t), c.sql)
    return Compiled(t, lambda rows: _cast(c.eval(rows), t, safe=False, sql=c.sql), c.sql, c.const, False)


# --------------------------------------------------------------------------- casts

_CASTS = {
    ("int", "int"), ("int", "float"), ("int", "bool"), ("float", "int"), ("float", "float"), ("float", "bool"),
    ("bool", "int"), ("bool", "float"), ("bool", "bool"),
    ("string", "int"), ("string", "float"), ("string", "bool"), ("string", "timestamp"), ("string", "date"),
    ("timestamp", "timestamp"), ("timestamp", "date"), ("date", "timestamp"), ("date", "date"),
}
_TO_STRING = {"int", "float", "bool", "string", "timestamp", "date"}


def _can_cast(src: pa.DataType, dst: pa.DataType) -> bool:
    ks, kd = _kind(src), _kind(dst)
    return src == dst or ks == "null" or (kd == "string" and ks in _TO_STRING) or (ks, kd) in _CASTS


def _cast(v: Value, dst: pa.DataType, *, safe: bool, sql: str) -> Value:
    """CAST (safe=False: a value that does not convert is an error) or TRY_CAST (NULL)."""
    if v.type == dst:
        return v
    scalar = isinstance(v, pa.Scalar)
    arr = pa.repeat(v, 1) if scalar else v
    if _kind(arr.type) == "null":
        out = pa.nulls(len(arr), dst)
    else:
        out = _try_cast(arr, dst)
    if not safe:
        bad = pc.and_(pc.is_valid(arr), pc.is_null(out))
        if pc.any(bad).as_py():
            first = arr[pc.index(bad, True).as_py()].as_py()
            raise SqlError(
                DATA_ERROR_CODE,
                f"could not convert {sql_type_name(arr.type)} value {first!r} to {sql_type_name(dst)} in {sql}",
            )
    return out[0] if scalar else out


def _nullify(values: pa.Array, ok: pa.Array) -> pa.Array:
    return pc.if_else(ok, values, pa.scalar(None, values.type))


def _nullify_like(v: Value, value: pa.Scalar) -> Value:
    """`value` where `v` is not NULL."""
    return pc.if_else(pc.is_valid(v), value, pa.scalar(None, value.type))


def _try_cast(arr: pa.Array, dst: pa.DataType) -> pa.Array:
    ks, kd = _kind(arr.type), _kind(dst)
    if kd == "string":
        return _to_varchar(arr)
    if ks == "string":
        return {"int": _str_to_int, "float": _str_to_float, "bool": _str_to_bool, "timestamp": _str_to_temporal,
                "date": _str_to_temporal}[kd](arr, dst)
    if kd == "int" and ks == "float":
        # DuckDB rounds DOUBLE -> integer half to even (2.5 -> 2, 3.5 -> 4)
        return _int_in_range(pc.round(arr, 0, round_mode="half_to_even"), dst)
    if kd == "int" and ks == "int":
        return _int_in_range(arr, dst)
    if kd == "bool" and ks in _NUMERIC:
        return pc.not_equal(arr, pa.scalar(0, arr.type))  # NaN is true, as in DuckDB
    if kd == "timestamp" and ks == "timestamp":
        naive = arr.cast(pa.timestamp(arr.type.unit))  # UTC wall clock for tz-aware values
        return naive.cast(pa.timestamp(dst.unit), safe=False).cast(dst)
    if kd == "timestamp" and ks == "date":
        return arr.cast(pa.timestamp(dst.unit)).cast(dst)
    if kd == "date" and ks == "timestamp":
        return arr.cast(pa.timestamp(arr.type.unit)).cast(dst)
    return arr.cast(dst, safe=False)


def _int_in_range(arr: pa.Array, dst: pa.DataType) -> pa.Array:
    bits = dst.bit_width
    lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1)
    if pa.types.is_floating(arr.type):
        ok = pc.and_(pc.greater_equal(arr, float(lo)), pc.less(arr, float(hi)))  # NaN/inf fail
    elif arr.type.bit_width <= bits and pa.types.is_signed_integer(arr.type):
        return arr.cast(dst)
    else:
        ok = pc.and_(pc.greater_equal(arr, lo), pc.less_equal(arr, hi - 1))
    return _nullify(arr, ok).cast(dst, safe=False)


def _groups(arr: pa.Array, pattern: str) -> tuple[pa.Array, dict[str, pa.Array]]:
    """Named groups of a full-string regex match: (matched, {group: string, '' if absent})."""
    m = pc.extract_regex(arr, pattern)
    names = [m.type.field(i).name for i in range(m.type.num_fields)]
    matched = pc.fill_null(pc.is_valid(m), False)
    return matched, {n: pc.fill_null(pc.struct_field(m, n), "") for n in names}


def _or_zero(digits: pa.Array) -> pa.Array:
    return pc.if_else(pc.equal(digits, ""), "0", digits)


_NUM_RE = (
    r"^(?P<sign>[+-]?)(?P<int>[0-9]+(?:_[0-9]+)*)?(?:\.(?P<frac>[0-9]+(?:_[0-9]+)*)?)?"
    r"(?:[eE](?P<exp>[+-]?[0-9]+))?$"
)


def _str_to_int(arr: pa.Array, dst: pa.DataType) -> pa.Array:
    # DuckDB trims whitespace, allows '_' between digits, and rounds a fraction half away from
    # zero ('1.5' -> 2, '-1.5' -> -2) judged on the digits, so '1.4999999999999999999' -> 1.
    try:  # fast path: Arrow takes plain [-]digits only, all of which DuckDB reads the same way
        return _int_in_range(arr.cast(pa.int64()), dst)
    except pa.ArrowInvalid:
        pass
    matched, g = _groups(pc.utf8_trim_whitespace(arr), _NUM_RE)
    int_digits = pc.utf8_ltrim(pc.replace_substring(g["int"], "_", ""), characters="0")
    frac = pc.replace_substring(g["frac"], "_", "")
    ok = pc.and_(matched, pc.or_(pc.not_equal(g["int"], ""), pc.not_equal(frac, "")))
    has_exp = pc.not_equal(g["exp"], "")
    fits = pc.less_equal(pc.utf8_length(int_digits), 19)
    # without an exponent: exact, through DECIMAL(21,1) (19 digits and the rounding digit)
    plain_ok = pc.and_(ok, pc.and_(pc.invert(has_exp), fits))
    first_frac = _or_zero(pc.utf8_slice_codeunits(frac, 0, 1))
    text = pc.binary_join_element_wise(g["sign"], _or_zero(int_digits), ".", first_frac, "")
    dec = pc.if_else(plain_ok, text, "0").cast(pa.decimal128(21, 1))
    dec = pc.round(dec, 0, round_mode="half_towards_infinity")
    lo, hi = -(2 ** (dst.bit_width - 1)), 2 ** (dst.bit_width - 1) - 1
    dec_ok = pc.and_(pc.greater_equal(dec, pa.scalar(decimal.Decimal(lo), dec.type)),
                     pc.less_equal(dec, pa.scalar(decimal.Decimal(hi), dec.type)))
    in_range = pc.if_else(dec_ok, dec, pa.scalar(decimal.Decimal(0), dec.type))
    plain = _nullify(in_range.cast(dst), pc.and_(plain_ok, dec_ok))
    # with an exponent ('1.5e1'): through DOUBLE, rounding half away from zero as DuckDB does
    sci_ok = pc.and_(ok, has_exp)
    sci_text = pc.binary_join_element_wise(g["sign"], _or_zero(int_digits), ".", _or_zero(frac), "e", g["exp"], "")
    dbl = pc.if_else(sci_ok, sci_text, "0").cast(pa.float64())
    sci = _int_in_range(_nullify(pc.round(dbl, 0, round_mode="half_towards_infinity"), sci_ok), dst)
    return pc.if_else(has_exp, sci, plain)


def _str_to_float(arr: pa.Array, dst: pa.DataType) -> pa.Array:
    s = pc.utf8_trim_whitespace(arr)
    numeric = pc.and_(pc.match_substring_regex(s, _NUM_RE), pc.match_substring_regex(s, r"^[+-]?\.?[0-9]"))
    special = pc.match_substring_regex(s, r"^[+-]?(inf|infinity|nan)$", ignore_case=True)
    ok = pc.fill_null(pc.or_(numeric, special), False)
    clean = pc.if_else(ok, pc.replace_substring(s, "_", ""), "0")
    return _nullify(clean.cast(dst), ok)


def _str_to_bool(arr: pa.Array, dst: pa.DataType) -> pa.Array:
    low = pc.utf8_lower(arr)  # DuckDB does not trim here: ' true ' is not a boolean
    true = pc.is_in(low, value_set=pa.array(["true", "t", "yes", "y", "1"]))
    false = pc.is_in(low, value_set=pa.array(["false", "f", "no", "n", "0"]))
    return pc.if_else(true, True, pc.if_else(false, False, pa.scalar(None, pa.bool_())))


_TS_RE = (
    r"^\s*(?P<y>[0-9]{4})-(?P<mo>[0-9]{1,2})-(?P<d>[0-9]{1,2})"
    r"(?:[T ](?P<h>[0-9]{1,2}):(?P<mi>[0-9]{1,2})(?::(?P<s>[0-9]{1,2})(?:\.(?P<f>[0-9]+))?)?)?"
    r"\s*(?P<tz>Z|UTC|[+-][0-9]{2}(?::?[0-9]{2})?)?\s*$"
)


def _int_of(digits: pa.Array) -> pa.Array:
    return _or_zero(digits).cast(pa.int64())


def _str_to_temporal(arr: pa.Array, dst: pa.DataType) -> pa.Array:
    """ISO-8601 dates and timestamps: 'YYYY-MM-DD[( |T)hh:mm[:ss[.fff]]][Z|UTC|±hh[:mm]]'.

    The offset is applied when the target has a time zone and ignored otherwise, as in
    DuckDB. Calendar checks are done here because Arrow's strptime rolls 02-30 over to March."""
    ok, g = _groups(arr, _TS_RE)
    y, mo, d = _int_of(g["y"]), _int_of(g["mo"]), _int_of(g["d"])
    h, mi, s = _int_of(g["h"]), _int_of(g["mi"]), _int_of(g["s"])
    leap = pc.or_(pc.and_(pc.equal(pc.remainder(y, 4), 0), pc.not_equal(pc.remainder(y, 100), 0)),
                  pc.equal(pc.remainder(y, 400), 0))
    dim = pc.if_else(pc.equal(mo, 2), pc.if_else(leap, 29, 28),
                     pc.if_else(pc.is_in(mo, value_set=pa.array([4, 6, 9, 11])), 30, 31))
    for part, lo, hi in ((mo, 1, 12), (d, 1, 31), (h, 0, 23), (mi, 0, 59), (s, 0, 59)):
        ok = pc.and_(ok, pc.and_(pc.greater_equal(part, lo), pc.less_equal(part, hi)))
    ok = pc.and_(ok, pc.less_equal(d, dim))
    iso = pc.binary_join_element_wise(g["y"], pc.utf8_lpad(g["mo"], 2, "0"), pc.utf8_lpad(g["d"], 2, "0"), "-")
    days = pc.if_else(ok, iso, "1970-01-01").cast(pa.date32()).cast(pa.int32()).cast(pa.int64())
    if _kind(dst) == "date":
        return _nullify(days.cast(pa.int32()).cast(dst), ok)
    frac = pc.utf8_rpad(pc.utf8_slice_codeunits(g["f"], 0, 6), 6, "0").cast(pa.int64())
    seconds = pc.add(pc.multiply(pc.add(pc.multiply(h, 60), mi), 60), s)
    micros = pc.add(pc.add(pc.multiply(days, 86_400_000_000), pc.multiply(seconds, 1_000_000)), frac)
    if dst.tz:
        off = pc.replace_substring(g["tz"], ":", "")
        off_h, off_m = _int_of(pc.utf8_slice_codeunits(off, 1, 3)), _int_of(pc.utf8_slice_codeunits(off, 3, 5))
        numeric_off = pc.match_substring_regex(off, r"^[+-]")
        off_us = pc.multiply(pc.add(pc.multiply(off_h, 60), off_m), 60_000_000)
        off_us = pc.if_else(numeric_off, pc.if_else(pc.starts_with(off, "-"), pc.negate(off_us), off_us), 0)
        micros = pc.subtract(micros, off_us)
    out = micros.cast(pa.timestamp("us", dst.tz))
    return _nullify(out.cast(dst, safe=False), ok)


def _to_varchar(arr: pa.Array) -> pa.Array:
    k = _kind(arr.type)
    if k == "float":
        return _float_to_varchar(arr)
    if k == "timestamp":
        # DuckDB prints the fraction without trailing zeros and '+00' for WITH TIME ZONE
        text = pc.strftime(arr.cast(pa.timestamp(arr.type.unit)), format="%Y-%m-%d %H:%M:%S")
        text = pc.replace_substring_regex(pc.replace_substring_regex(text, r"(\.[0-9]*?)0+$", r"\1"), r"\.$", "")
        return pc.binary_join_element_wise(text, "+00", "") if arr.type.tz else text
    return arr.cast(pa.string())


_FLOAT_TEXT_RE = r"^(?P<sign>-?)(?P<int>[0-9]+)(?:\.(?P<frac>[0-9]+))?(?:e(?P<exp>[+-][0-9]+))?$"


def _float_to_varchar(arr: pa.Array) -> pa.Array:
    """Shortest round-trip digits laid out like DuckDB (and Python's repr): plain notation
    for exponents -5 < e < 16 with at least one decimal ('1.0'), else '1.5e+300'.

    Arrow's cast gives the same digits in another layout; re-laying them out needs a slice
    width per row, so rows are processed grouped by decimal-point position (a few hundred
    values at most) rather than one by one."""
    text = arr.cast(pa.string())
    matched, g = _groups(text, _FLOAT_TEXT_RE)
    digits = pc.binary_join_element_wise(g["int"], g["frac"], "")
    lead = pc.utf8_ltrim(digits, characters="0")
    leading_zeros = pc.subtract(pc.utf8_length(digits), pc.utf8_length(lead))
    exponent = _int_of(pc.replace_substring(g["exp"], "+", "")).cast(pa.int32())
    point = pc.add(pc.subtract(pc.utf8_length(g["int"]), leading_zeros), exponent)
    sig = pc.utf8_rtrim(lead, characters="0")
    is_zero = pc.equal(sig, "")
    point = pc.if_else(pc.or_(is_zero, pc.invert(matched)), 1, point)
    pieces, positions = [], []
    order = pc.sort_indices(point)  # rows of one point position are then a contiguous run
    offset = 0
    for run in pc.value_counts(point.take(order)).to_pylist():
        p, count = run["values"], run["counts"]
        idx = order.slice(offset, count)
        offset += count
        d = sig.take(idx)
        e = p - 1
        if -4 <= e < 16:
            if p <= 0:
                body = pc.binary_join_element_wise("0." + "0" * -p, d, "")
            else:
                padded = pc.utf8_rpad(d, p, "0")
                frac = pc.utf8_slice_codeunits(padded, p)
                body = pc.binary_join_element_wise(pc.utf8_slice_codeunits(padded, 0, p), _or_zero(frac), ".")
        else:
            head, tail = pc.utf8_slice_codeunits(d, 0, 1), pc.utf8_slice_codeunits(d, 1)
            mant = pc.if_else(pc.equal(tail, ""), head, pc.binary_join_element_wise(head, tail, "."))
            body = pc.binary_join_element_wise(mant, f"e{'+' if e >= 0 else '-'}{abs(e):02d}", "")
        body = pc.if_else(is_zero.take(idx), "0.0", body)
        body = pc.binary_join_element_wise(g["sign"].take(idx), body, "")
        pieces.append(pc.if_else(matched.take(idx), body, text.take(idx)))  # nan, inf, -inf as Arrow prints them
        positions.append(idx)
    if not pieces:
        return pa.nulls(len(arr), pa.string())
    out = pa.concat_arrays(pieces).take(pc.sort_indices(pa.concat_arrays(positions)))
    return _nullify(out, pc.is_valid(arr))


# --------------------------------------------------------------------------- parameters

_MARK = "zzfederatorparam{}zz"


def _anonymous_in_text_order(tree: exp.Expression) -> list[exp.Placeholder]:
    """The `?` placeholders of `tree` in the order they appear in the SQL text.

    sqlglot keeps no token positions on placeholders, and a tree walk visits LIMIT before FROM,
    so the order comes from the generator, which writes clauses in SQL's grammar order: mark
    each `?` of a copy, render it, and read the marks back."""
    nodes = [n for n in tree.walk() if isinstance(n, exp.Placeholder) and not n.this]
    if not nodes:
        return []
    copy = tree.copy()
    marks = [n for n in copy.walk() if isinstance(n, exp.Placeholder) and not n.this]
    for i, node in enumerate(marks):
        node.set("this", _MARK.format(i))
    order = [int(m) for m in re.findall(_MARK.format(r"(\d+)"), copy.sql(dialect="duckdb"))]
    return [nodes[i] for i in order]


def number_params(statement: exp.Expression) -> int:
    """Number the anonymous `?` parameters of a whole statement, in place, by their position in
    the SQL text: the k-th `?` (1-based) becomes DuckDB's positional `$k`, so each expression
    compiled from the statement later reads `params[k-1]`. Call it once, on the whole parsed
    statement, before compiling its parts (a part compiled alone would number its own `?`
    from 1). Returns how many values the statement needs (the highest `$k`)."""
    anonymous = _anonymous_in_text_order(statement)
    numbered = [n for n in statement.walk() if isinstance(n, exp.Placeholder) and n.this]
    if anonymous and numbered:
        raise SqlError("INVALID_PARAMETER", "a statement cannot mix ? and $n parameters")
    for i, node in enumerate(anonymous):
        node.set("this", str(i + 1))
    if anonymous:
        return len(anonymous)
    return max((_param_number(n) for n in numbered), default=0)


def _param_number(node: exp.Placeholder) -> int:
    text = str(node.this)
    if not text.isdigit() or int(text) < 1:
        raise unsupported(f"parameter {node.sql(dialect='duckdb')}", "use ? or $1, $2, ...")
    return int(text)


def _param_scalar(value: Any, k: int) -> tuple[pa.Scalar, bool]:
    """(Arrow scalar, is a string that adapts like a literal) for the value of parameter $k."""
    if value is None:
        return pa.scalar(None), False
    if isinstance(value, bool):
        return pa.scalar(value, pa.bool_()), False
    if isinstance(value, int):
        if not -(2**63) <= value < 2**63:
            raise SqlError("INVALID_PARAMETER", f"parameter ${k} ({value}) is out of BIGINT range")
        return pa.scalar(value, pa.int64()), False
    if isinstance(value, (float, decimal.Decimal)):
        return pa.scalar(float(value), pa.float64()), False
    if isinstance(value, str):
        return pa.scalar(value, pa.string()), True
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            return pa.scalar(value.astimezone(dt.timezone.utc), pa.timestamp("us", "UTC")), False
        return pa.scalar(value, pa.timestamp("us")), False
    if isinstance(value, dt.date):
        return pa.scalar(value, pa.date32()), False
    if isinstance(value, bytes):
        return pa.scalar(value, pa.binary()), False
    raise SqlError("INVALID_PARAMETER", f"parameter ${k} has unsupported type {type(value).__name__}")


# --------------------------------------------------------------------------- compiler

_SQL_TYPES = {
    "TINYINT": pa.int8(), "SMALLINT": pa.int16(), "INT": pa.int32(), "BIGINT": pa.int64(),
    "DOUBLE": pa.float64(), "FLOAT": pa.float32(), "TEXT": pa.string(), "VARCHAR": pa.string(),
    "BOOLEAN": pa.bool_(), "TIMESTAMP": pa.timestamp("us"), "TIMESTAMPNTZ": pa.timestamp("us"),
    "DATETIME": pa.timestamp("us"), "TIMESTAMPTZ": pa.timestamp("us", "UTC"), "DATE": pa.date32(),
}

_FUNCTIONS = "ABS, CAST, COALESCE, IF, LENGTH, LOWER, ROUND, SUBSTR/SUBSTRING, TRY_CAST, UPPER"

_CMP = {exp.EQ: "eq", exp.NEQ: "ne", exp.LT: "lt", exp.LTE: "le", exp.GT: "gt", exp.GTE: "ge"}


def _compare(op: str, x: Value, y: Value, is_float: bool) -> Value:
    """SQL comparison; for DOUBLE with DuckDB's total order (NaN = NaN, NaN above all)."""
    if op in ("gt", "ge"):
        return _compare("lt" if op == "gt" else "le", y, x, is_float)
    if op == "ne":
        return pc.invert(_compare("eq", x, y, is_float))
    plain = {"eq": pc.equal, "lt": pc.less, "le": pc.less_equal}[op](x, y)
    if not is_float:
        return plain
    nx, ny = pc.is_nan(x), pc.is_nan(y)
    either = pc.or_(nx, ny)
    nan_case = {"eq": pc.and_(nx, ny), "lt": pc.and_(pc.invert(nx), ny), "le": ny}[op]
    return pc.if_else(either, nan_case, plain)


def _normalize_float(v: Value) -> Value:
    """One NaN and one zero, so hashing kernels (IN, GROUP BY, DISTINCT) see DuckDB's equality."""
    return pc.if_else(pc.is_nan(v), pa.scalar(float("nan"), v.type), pc.add(v, pa.scalar(0.0, v.type)))


def _is_float(t: pa.DataType) -> bool:
    return _kind(t) == "float"


class _Compiler:
    def __init__(self, schema: pa.Schema, params: Sequence[Any], local: dict[int, int]):
        self.schema, self.params, self.local = schema, params, local
        self.by_lower: dict[str, str] = {}
        for name in schema.names:
            self.by_lower.setdefault(name.lower(), name)

    def compile(self, node: exp.Expression) -> Compiled:
        for cls in type(node).__mro__:
            method = getattr(self, f"_c_{cls.__name__}", None)
            if method is not None:
                return _fold(method(node))
            if cls is exp.Expression:
                break
        if isinstance(node, exp.Anonymous) or (isinstance(node, exp.Func) and not isinstance(node, exp.AggFunc)):
            raise unsupported(f"function {node.sql(dialect='duckdb')}", f"supported functions: {_FUNCTIONS}")
        raise unsupported(node.sql(dialect="duckdb"))

    # leaves ----------------------------------------------------------------

    def _c_Column(self, node: exp.Column) -> Compiled:
        if isinstance(node.this, exp.Star):
            raise unsupported(node.sql(dialect="duckdb"))
        want = node.name
        name = want if want in self.schema.names else self.by_lower.get(want.lower())
        if name is None:
            columns = ", ".join(self.schema.names)
            raise SqlError("UNKNOWN_COLUMN", f"unknown column '{want}'; columns are {columns}")
        return Compiled(self.schema.field(name).type, lambda rows: rows.column(name), node.sql(dialect="duckdb"))

    def _c_Literal(self, node: exp.Literal, negative: bool = False) -> Compiled:
        sql = ("-" if negative else "") + node.sql(dialect="duckdb")
        if node.is_string:
            return _const(pa.scalar(node.this, pa.string()), sql, literal_string=True)
        text = ("-" if negative else "") + node.this
        if re.fullmatch(r"-?[0-9]+", text):
            value = int(text)
            if not -(2**63) <= value < 2**63:
                raise unsupported(f"integer literal {text} outside BIGINT range")
            return _const(pa.scalar(value, pa.int64()), sql)
        try:
            return _const(pa.scalar(float(text), pa.float64()), sql)
        except ValueError:
            raise unsupported(f"literal {sql}") from None

    def _c_Boolean(self, node: exp.Boolean) -> Compiled:
        return _const(pa.scalar(bool(node.this), pa.bool_()), node.sql(dialect="duckdb"))

    def _c_Null(self, node: exp.Null) -> Compiled:
        return _const(pa.scalar(None), "NULL")

    def _c_Placeholder(self, node: exp.Placeholder) -> Compiled:
        k = _param_number(node) if node.this else self.local[id(node)]
        if k > len(self.params):
            given = len(self.params)
            raise SqlError("INVALID_PARAMETER", f"no value for parameter ${k}: {given} parameter(s) given")
        scalar, is_str = _param_scalar(self.params[k - 1], k)
        return _const(scalar, f"${k}", literal_string=is_str)

    def _c_Paren(self, node: exp.Paren) -> Compiled:
        return self.compile(node.this)

    def _c_Alias(self, node: exp.Alias) -> Compiled:
        return self.compile(node.this)

    # logic -----------------------------------------------------------------

    def _bool_operand(self, node: exp.Expression, where: exp.Expression) -> Compiled:
        c = self.compile(node)
        if _kind(c.type) == "bool":
            return c
        if _kind(c.type) == "null" or c.literal_string:
            return _coerce(c, pa.bool_())
        where_sql = where.sql(dialect="duckdb")
        raise unsupported(f"{sql_type_name(c.type)} operand {c.sql} in {where_sql}", "a BOOLEAN is needed")

    def _c_And(self, node: exp.And) -> Compiled:
        return _and(self._bool_operand(node.this, node), self._bool_operand(node.expression, node), node)

    def _c_Or(self, node: exp.Or) -> Compiled:
        a, b = self._bool_operand(node.this, node), self._bool_operand(node.expression, node)
        if _is(a, True) or _is(b, True):  # DuckDB folds x OR TRUE without evaluating x
            return _const(pa.scalar(True), node.sql(dialect="duckdb"))
        return _derive(pa.bool_(), lambda r: pc.or_kleene(a.eval(r), b.eval(r)), node, a, b)

    def _c_Not(self, node: exp.Not) -> Compiled:
        a = self._bool_operand(node.this, node)
        return _derive(pa.bool_(), lambda r: pc.invert(a.eval(r)), node, a)

    def _c_Is(self, node: exp.Is) -> Compiled:
        a, rhs = self.compile(node.this), node.expression
        if isinstance(rhs, exp.Null):
            return _derive(pa.bool_(), lambda r: pc.is_null(a.eval(r)), node, a)
        if isinstance(rhs, exp.Boolean):
            a = self._bool_operand(node.this, node)
            want = bool(rhs.this)
            return _derive(pa.bool_(), lambda r: pc.fill_null(pc.equal(a.eval(r), want), False), node, a)
        raise unsupported(node.sql(dialect="duckdb"))

    # comparisons -----------------------------------------------------------

    def _pair(self, node: exp.Expression, left: exp.Expression, right: exp.Expression) -> tuple[Compiled, Compiled]:
        a, b = self.compile(left), self.compile(right)
        t = _comparable(_common([a, b], node, columns_adapt=True))
        return _coerce(a, t), _coerce(b, t)

    def _comparison(self, node: exp.Expression) -> Compiled:
        op = _CMP[type(node)]
        a, b = self._pair(node, node.this, node.expression)
        f = _is_float(a.type)
        return _strict(pa.bool_(), lambda r: _compare(op, a.eval(r), b.eval(r), f), node, a, b)

    _c_EQ = _c_NEQ = _c_LT = _c_LTE = _c_GT = _c_GTE = _comparison

    def _null_safe(self, node: exp.Expression) -> Compiled:
        a, b = self._pair(node, node.this, node.expression)
        f, negate = _is_float(a.type), isinstance(node, exp.NullSafeNEQ)

        def run(r: _Rows) -> Value:
            x, y = a.eval(r), b.eval(r)
            nx, ny = pc.is_null(x), pc.is_null(y)
            same = pc.if_else(pc.or_(nx, ny), pc.and_(nx, ny), pc.fill_null(_compare("eq", x, y, f), False))
            return pc.invert(same) if negate else same

        return _derive(pa.bool_(), run, node, a, b)

    _c_NullSafeEQ = _c_NullSafeNEQ = _null_safe

    def _c_Between(self, node: exp.Between) -> Compiled:
        if node.args.get("symmetric"):
            raise unsupported("BETWEEN SYMMETRIC")
        parts = [self.compile(node.this), self.compile(node.args["low"]), self.compile(node.args["high"])]
        t = _comparable(_common(parts, node, columns_adapt=False))
        x, lo, hi = (_coerce(p, t) for p in parts)
        f = _is_float(t)

        # x >= lo AND x <= hi, folded as DuckDB does (a constant FALSE half decides it)
        ge = _fold(_strict(pa.bool_(), lambda r: _compare("ge", x.eval(r), lo.eval(r), f), node, x, lo))
        le = _fold(_strict(pa.bool_(), lambda r: _compare("le", x.eval(r), hi.eval(r), f), node, x, hi))
        return _and(ge, le, node)

    def _c_In(self, node: exp.In) -> Compiled:
        if node.args.get("query") or node.args.get("unnest") or node.args.get("field") or not node.expressions:
            raise unsupported(node.sql(dialect="duckdb"), "IN takes a list of values here")
        x0 = self.compile(node.this)
        if x0.null:
            return _const(pa.scalar(None, pa.bool_()), node.sql(dialect="duckdb"))
        items0 = [self.compile(e) for e in node.expressions]
        t = _comparable(_common([x0, *items0], node, columns_adapt=True))
        x, items = _coerce(x0, t), [_coerce(i, t) for i in items0]
        f = _is_float(t)
        if all(i.const for i in items):
            values = [i.value() for i in items]
            has_null = any(v is None for v in values)
            value_set = pa.array([v for v in values if v is not None], t)
            if f:
                value_set = _normalize_float(value_set)

            def run(r: _Rows) -> Value:
                v = x.eval(r)
                found = pc.is_in(_normalize_float(v) if f else v, value_set=value_set)
                found = pc.if_else(pc.is_valid(v), found, pa.scalar(None, pa.bool_()))
                return pc.or_kleene(found, pa.scalar(None, pa.bool_())) if has_null else found

            return _derive(pa.bool_(), run, node, x)

        def run_any(r: _Rows) -> Value:  # non-constant list: x = i1 OR x = i2 ...
            v = x.eval(r)
            out: Value = pa.scalar(False)
            for i in items:
                out = pc.or_kleene(out, _compare("eq", v, i.eval(r), f))
            return out

        return _derive(pa.bool_(), run_any, node, x, *items)

    def _c_Like(self, node: exp.Expression, escape: str | None = None) -> Compiled:
        x = self.compile(node.this)
        pattern = self.compile(node.expression)
        if _kind(x.type) not in ("string", "null") or _kind(pattern.type) not in ("string", "null"):
            raise unsupported(f"{node.sql(dialect='duckdb')} on {sql_type_name(x.type)}", "LIKE needs VARCHAR")
        if not pattern.const:
            raise unsupported(f"{node.sql(dialect='duckdb')} with a non-constant pattern")
        text = pattern.value()
        negate = bool(node.args.get("negate"))
        if text is None:
            return _derive(pa.bool_(), lambda r: pa.scalar(None, pa.bool_()), node, x)
        regex = _like_regex(text, escape)
        icase = isinstance(node, exp.ILike)

        def run(r: _Rows) -> Value:
            v = x.eval(r)
            if isinstance(v, pa.Scalar):
                v = pa.array([v.as_py()], pa.string())
                m = pc.match_substring_regex(v, regex, ignore_case=icase)[0]
            else:
                m = pc.match_substring_regex(v.cast(pa.string()), regex, ignore_case=icase)
            return pc.invert(m) if negate else m

        return _strict(pa.bool_(), run, node, x)

    _c_ILike = _c_Like

    def _c_Escape(self, node: exp.Escape) -> Compiled:
        inner = node.this
        esc = self.compile(node.expression)
        if not isinstance(inner, (exp.Like, exp.ILike)) or not esc.const or _kind(esc.type) != "string":
            raise unsupported(node.sql(dialect="duckdb"))
        ch = esc.value()
        if len(ch) > 1:
            raise unsupported(f"ESCAPE {ch!r}", "the escape must be one character")
        return self._c_Like(inner, ch or None)

    # arithmetic ------------------------------------------------------------

    def _numeric(self, node: exp.Expression, child: exp.Expression) -> Compiled:
        c = self.compile(child)
        if _kind(c.type) not in ("int", "float", "null"):
            raise unsupported(f"{node.sql(dialect='duckdb')} on {sql_type_name(c.type)}", "a number is needed")
        return c

    def _arith(self, node: exp.Expression) -> Compiled:
        a, b = self._numeric(node, node.this), self._numeric(node, node.expression)
        ints = all(_kind(c.type) in ("int", "null") for c in (a, b))
        t = pa.float64() if isinstance(node, exp.Div) or not ints else pa.int64()
        a, b = _coerce(a, t), _coerce(b, t)
        sql = node.sql(dialect="duckdb")
        if ints and not isinstance(node, exp.Div):
            kernel = {exp.Add: pc.add_checked, exp.Sub: pc.subtract_checked, exp.Mul: pc.multiply_checked,
                      exp.IntDiv: pc.divide_checked, exp.Mod: pc.remainder_checked}[type(node)]
            return _strict(t, lambda r: _guard(sql, kernel, a.eval(r), b.eval(r)), node, a, b)
        if isinstance(node, exp.IntDiv):
            def float_intdiv(r: _Rows) -> Value:  # DuckDB: DOUBLE // 0 is an error, otherwise plain division
                x, y = a.eval(r), b.eval(r)
                if pc.any(pc.and_(pc.equal(y, 0.0), pc.is_valid(x))).as_py():
                    raise SqlError(DATA_ERROR_CODE, f"division by zero in {sql}")
                return pc.divide(x, y)

            return _strict(t, float_intdiv, node, a, b)
        kernel = {exp.Add: pc.add, exp.Sub: pc.subtract, exp.Mul: pc.multiply, exp.Div: pc.divide,
                  exp.Mod: pc.remainder}[type(node)]
        return _strict(t, lambda r: kernel(a.eval(r), b.eval(r)), node, a, b)

    _c_Add = _c_Sub = _c_Mul = _c_Div = _c_IntDiv = _c_Mod = _arith

    def _c_Neg(self, node: exp.Neg) -> Compiled:
        if isinstance(node.this, exp.Literal) and not node.this.is_string:
            return self._c_Literal(node.this, negative=True)  # so -9223372036854775808 is a BIGINT
        a = self._numeric(node, node.this)
        if _kind(a.type) == "null":
            a = _coerce(a, pa.int64())
        sql, kernel = node.sql(dialect="duckdb"), pc.negate_checked if _kind(a.type) == "int" else pc.negate
        return _strict(a.type, lambda r: _guard(sql, kernel, a.eval(r)), node, a)

    def _c_Abs(self, node: exp.Abs) -> Compiled:
        a = self._numeric(node, node.this)
        if _kind(a.type) == "null":
            a = _coerce(a, pa.int64())
        sql, kernel = node.sql(dialect="duckdb"), pc.abs_checked if _kind(a.type) == "int" else pc.abs
        return _strict(a.type, lambda r: _guard(sql, kernel, a.eval(r)), node, a)

    def _c_Round(self, node: exp.Round) -> Compiled:
        a = self._numeric(node, node.this)
        if _kind(a.type) == "null":
            a = _coerce(a, pa.float64())
        digits_node = node.args.get("decimals")
        digits: int | None = 0
        if digits_node is not None:
            d = self.compile(digits_node)
            if not d.const or _kind(d.type) not in ("int", "null"):
                raise unsupported(node.sql(dialect="duckdb"), "ROUND takes a constant integer number of digits")
            digits = d.value()
        sql = node.sql(dialect="duckdb")
        if digits is None:
            return _derive(a.type, lambda r: pa.scalar(None, a.type), node, a)
        if _kind(a.type) == "int":
            if digits >= 0:
                return a
            half_away = "half_towards_infinity"  # Arrow's name for half away from zero
            return _strict(a.type, lambda r: _guard(sql, pc.round, a.eval(r), digits, round_mode=half_away), node, a)
        return _strict(a.type, lambda r: _round_double(a.eval(r), digits), node, a)

    # strings ---------------------------------------------------------------

    def _string(self, node: exp.Expression, child: exp.Expression) -> Compiled:
        c = self.compile(child)
        if _kind(c.type) == "null":
            return _coerce(c, pa.string())
        if _kind(c.type) != "string":
            raise unsupported(f"{node.sql(dialect='duckdb')} on {sql_type_name(c.type)}", "a VARCHAR is needed")
        return c

    def _c_Lower(self, node: exp.Lower) -> Compiled:
        a = self._string(node, node.this)
        return _strict(a.type, lambda r: pc.utf8_lower(a.eval(r)), node, a)

    def _c_Upper(self, node: exp.Upper) -> Compiled:
        a = self._string(node, node.this)
        return _strict(a.type, lambda r: pc.utf8_upper(a.eval(r)), node, a)

    def _c_Length(self, node: exp.Length) -> Compiled:
        a = self._string(node, node.this)  # characters (code points), as DuckDB's length()
        return _strict(pa.int64(), lambda r: pc.utf8_length(a.eval(r)).cast(pa.int64()), node, a)

    def _c_Substring(self, node: exp.Substring) -> Compiled:
        a = self._string(node, node.this)
        args = []
        for key in ("start", "length"):
            arg = node.args.get(key)
            if arg is None:
                args.append(None)
                continue
            c = self.compile(arg)
            if not c.const or _kind(c.type) not in ("int", "null"):
                raise unsupported(node.sql(dialect="duckdb"), "SUBSTRING takes constant integer start and length")
            args.append((c.value(),))
        start, length = args
        if start is None or start[0] is None or (length is not None and length[0] is None):
            return _derive(pa.string(), lambda r: pa.scalar(None, pa.string()), node, a)
        lo, hi = _substring_slice(start[0], None if length is None else length[0])
        if lo is None:
            empty = pa.scalar("", pa.string())
            return _derive(pa.string(), lambda r: _nullify_like(a.eval(r), empty), node, a)
        return _strict(pa.string(), lambda r: pc.utf8_slice_codeunits(a.eval(r), lo, hi), node, a)

    def _c_DPipe(self, node: exp.DPipe) -> Compiled:
        parts = []
        for child in (node.this, node.expression):
            c = self.compile(child)
            if not _can_cast(c.type, pa.string()):
                raise unsupported(f"{node.sql(dialect='duckdb')} on {sql_type_name(c.type)}")
            parts.append(_coerce(c, pa.string()))
        a, b = parts
        return _strict(pa.string(), lambda r: pc.binary_join_element_wise(a.eval(r), b.eval(r), ""), node, a, b)

    # conditionals and casts -------------------------------------------------

    def _c_Case(self, node: exp.Case) -> Compiled:
        operand = self.compile(node.this) if node.this else None
        conds: list[Compiled] = []
        for when in node.args.get("ifs") or []:
            if operand is None:
                conds.append(self._bool_operand(when.this, node))
            else:
                value = self.compile(when.this)
                t = _comparable(_common([operand, value], node, columns_adapt=True))
                x, y, f = _coerce(operand, t), _coerce(value, t), _is_float(t)
                eq = lambda r, x=x, y=y, f=f: _compare("eq", x.eval(r), y.eval(r), f)  # noqa: E731
                conds.append(Compiled(pa.bool_(), eq, node.sql(dialect="duckdb")))
        results = [self.compile(when.args["true"]) for when in node.args.get("ifs") or []]
        default = node.args.get("default")
        results.append(self.compile(default) if default is not None else _const(pa.scalar(None), "NULL"))
        t = _common(results, node, columns_adapt=False)
        return _case([_fold(c) for c in conds], [_coerce(c, t) for c in results], t, node)

    def _c_If(self, node: exp.If) -> Compiled:
        cond = self._bool_operand(node.this, node)
        false = node.args.get("false")
        otherwise = self.compile(false) if false is not None else _const(pa.scalar(None), "NULL")
        results = [self.compile(node.args["true"]), otherwise]
        t = _common(results, node, columns_adapt=False)
        return _case([cond], [_coerce(c, t) for c in results], t, node)

    def _c_Coalesce(self, node: exp.Coalesce) -> Compiled:
        args = [self.compile(node.this), *(self.compile(e) for e in node.expressions)]
        t = _common(args, node, columns_adapt=False)
        args = [_coerce(a, t) for a in args]

        def run(r: _Rows) -> Value:  # later arguments only on rows still NULL, as in DuckDB
            out = _as_array(args[0].eval(r), r.n, t)
            for arg in args[1:]:
                missing = pc.is_null(out)
                idx = pc.indices_nonzero(missing)
                if len(idx) == 0:
                    break
                fill = _as_array(arg.eval(r.subset(idx)), len(idx), t)
                out = pc.replace_with_mask(out, missing, fill)
            return out

        return _derive(t, run, node, *args)

    def _c_Cast(self, node: exp.Cast) -> Compiled:
        to = node.args["to"]
        name = to.this.name if hasattr(to.this, "name") else str(to.this)
        dst = _SQL_TYPES.get(name)
        if dst is None or to.expressions and name not in ("TEXT", "VARCHAR") or node.args.get("format"):
            targets = "INTEGER, BIGINT, DOUBLE, VARCHAR, BOOLEAN, TIMESTAMP, TIMESTAMPTZ, DATE"
            raise unsupported(f"CAST to {to.sql(dialect='duckdb')}", f"supported: {targets}")
        src = self.compile(node.this)
        if not _can_cast(src.type, dst):
            what = f"CAST from {sql_type_name(src.type)} to {sql_type_name(dst)}"
            raise unsupported(f"{what} in {node.sql(dialect='duckdb')}")
        safe = isinstance(node, exp.TryCast) or bool(node.args.get("safe"))
        sql = node.sql(dialect="duckdb")
        return _strict(dst, lambda r: _cast(src.eval(r), dst, safe=safe, sql=sql), node, src)


def _and(a: Compiled, b: Compiled, node: exp.Expression) -> Compiled:
    if _is(a, False) or _is(b, False):  # DuckDB folds x AND FALSE without evaluating x
        return _const(pa.scalar(False), node.sql(dialect="duckdb"))
    return _derive(pa.bool_(), lambda r: pc.and_kleene(a.eval(r), b.eval(r)), node, a, b)


def _case(conds: list[Compiled], results: list[Compiled], t: pa.DataType, node: exp.Expression) -> Compiled:
    """CASE with DuckDB's evaluation: each WHEN sees only rows no earlier WHEN took, each THEN
    only the rows it returns (so guarded divisions and CASTs do not fail on other rows). WHENs
    known to be FALSE or NULL are dropped and one known TRUE ends the CASE, as DuckDB folds them."""
    kept: list[tuple[Compiled, Compiled]] = []
    otherwise = results[-1]
    for cond, result in zip(conds, results):
        if cond.known is None:
            kept.append((cond, result))
        elif _is(cond, True):
            otherwise = result
            break
    if not kept:
        return otherwise
    return _lazy_case([c for c, _ in kept], [r for _, r in kept] + [otherwise], t, node)


def _lazy_case(conds: list[Compiled], results: list[Compiled], t: pa.DataType, node: exp.Expression) -> Compiled:

    def run(r: _Rows) -> Value:
        remaining = _arange(r.n)
        pieces, positions = [], []
        for cond, result in zip(conds, results):
            if len(remaining) == 0:
                break
            sub = r.subset(remaining)
            hit = pc.fill_null(_as_array(cond.eval(sub), sub.n, pa.bool_()), False)
            taken = remaining.filter(hit)
            if len(taken):
                pieces.append(_as_array(result.eval(r.subset(taken)), len(taken), t))
                positions.append(taken)
            remaining = remaining.filter(pc.invert(hit))
        if len(remaining):
            pieces.append(_as_array(results[-1].eval(r.subset(remaining)), len(remaining), t))
            positions.append(remaining)
        if not pieces:
            return pa.nulls(0, t)
        return pa.concat_arrays(pieces).take(pc.sort_indices(pa.concat_arrays(positions)))

    return _derive(t, run, node, *conds, *results)


def _round_double(v: Value, digits: int) -> Value:
    """DuckDB's ROUND(DOUBLE, n): round(x * 10^n) / 10^n half away from zero (so 2.675 -> 2.68,
    1.005 -> 1.0), giving x back when that overflows; n < 0 divides instead and gives 0 then."""
    if digits == 0:
        return pc.round(v, 0, round_mode="half_towards_infinity")
    mod = 10.0**abs(digits) if abs(digits) <= 308 else float("inf")
    if digits > 0:
        out = pc.divide(pc.round(pc.multiply(v, mod), 0, round_mode="half_towards_infinity"), mod)
        fallback = v
    else:
        out = pc.multiply(pc.round(pc.divide(v, mod), 0, round_mode="half_towards_infinity"), mod)
        fallback = pa.scalar(0.0, pa.float64())
    bad = pc.or_(pc.is_nan(out), pc.is_inf(out))
    finite_in = pc.is_finite(v)
    return pc.if_else(finite_in, pc.if_else(bad, fallback, out), v)


def _substring_slice(start: int, length: int | None) -> tuple[int | None, int | None]:
    """DuckDB's substring(s, start[, length]) as a Python-style slice of code points.

    DuckDB counts 1-based from the front for start > 0, from the end for start < 0, and treats
    start = 0 as one before the first character; a negative length takes characters before the
    start. A slice with negative bounds is relative to each string's end, which Arrow applies
    per row. (None, None) means the empty string."""
    if start > 0:
        s0 = start - 1
        if length is None:
            return s0, None
        lo, hi = (s0, s0 + length) if length >= 0 else (max(s0 + length, 0), s0)
        return (lo, hi) if hi > lo else (None, None)
    if start == 0:
        if length is None:
            return 0, None
        return (0, length - 1) if length > 1 else (None, None)
    if length is None:
        return start, None
    if length >= 0:
        end = start + length
        return (start, end) if end < 0 else (start, None)
    return start + length, start


def _like_regex(pattern: str, escape: str | None) -> str:
    """LIKE pattern as an anchored RE2 regex: % any run, _ any one character (newlines
    included); no escape character unless ESCAPE names one (DuckDB treats '\\' literally)."""
    out, i = [], 0
    while i < len(pattern):
        ch = pattern[i]
        if escape is not None and ch == escape:
            i += 1
            if i == len(pattern):
                raise unsupported(f"LIKE pattern {pattern!r} ending in its escape character")
            out.append(re.escape(pattern[i]) if pattern[i] in r"\.^$|?*+()[]{}" else pattern[i])
        elif ch == "%":
            out.append(".*")
        elif ch == "_":
            out.append(".")
        elif ch in r"\.^$|?*+()[]{}":
            out.append("\\" + ch)
        else:
            out.append(ch)
        i += 1
    return "(?s)^" + "".join(out) + "$"


# --------------------------------------------------------------------------- public


def compile_expr(expr: exp.Expression, schema: pa.Schema, params: Sequence[Any] = ()) -> Compiled:
    """Compile a scalar SQL expression over rows of `schema`.

    Parameters: `$k` (and every `?` already numbered by `number_params` on the enclosing
    statement) reads `params[k-1]`; `?` not yet numbered are numbered within `expr` alone, from
    1, in SQL text order. Raises SqlError for unknown columns, missing parameters and anything
    outside the supported subset."""
    local = {id(n): i + 1 for i, n in enumerate(_anonymous_in_text_order(expr))}
    try:
        return _Compiler(schema, params, local).compile(expr)
    except SqlError:
        raise
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
        # e.g. a constant that cannot convert, found while folding IN lists or LIKE patterns
        raise SqlError(DATA_ERROR_CODE, f"cannot evaluate {expr.sql(dialect='duckdb')}: {e}") from e


def default_name(expr: exp.Expression) -> str:
    """Output column name: the alias if aliased, the column name for a column, else the SQL."""
    if isinstance(expr, exp.Alias):
        return expr.alias
    if isinstance(expr, exp.Column) and not isinstance(expr.this, exp.Star):
        return expr.name
    return expr.sql(dialect="duckdb")
