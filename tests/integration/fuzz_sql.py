"""A seeded differential SQL fuzzer: random SELECT statements, each run on Federator and on
DuckDB over the same rows, the answers compared.

Two stores: ``fz_items``, a kv store of JSON records with typed fields (strings with quotes,
wildcards and non-ASCII letters, integers up to the int64 limits, doubles, booleans,
timestamps, NULLs everywhere), and ``fz_nums``, a long → long store whose keys and values
include 0, ±1, ±2^31, ±2^62 and the int64 limits. Statements: projections, WHERE, GROUP BY
with aggregates (COUNT(DISTINCT NULL) included) and HAVING, DISTINCT, ORDER BY … LIMIT/OFFSET,
CASE, CAST/TRY_CAST, arithmetic that may overflow or divide by zero, string functions, key
lookups and ranges at the int64 edges, and ? parameters; outputs aliased or named by DuckDB
after their text.

The verdict for one statement (``judge``):
- ``equal``: the same columns (names and Arrow types) and rows (in order when the statement
  orders them totally, else as multisets; floats within a relative 1e-9), or both refused it
  (Federator with a 4xx, DuckDB with an error). Types Arrow's cannot tell apart (a HUGEINT
  sum and a DECIMAL(38,0)) are told by what the statements compute: typeof(), //, <<, hex();
- ``unsupported``: DuckDB answered, Federator said 422 UNSUPPORTED (a known gap, not a wrong answer);
- ``mismatch``: other columns or rows; or Federator answered where DuckDB errs; or Federator refused with
  another 4xx where DuckDB answers;
- ``5xx``: Federator answered 5xx (never right);
- ``crash``: no answer at all, or a node process died.

``make fuzz`` runs ``python -m tests.integration.fuzz_sql``: a broker and the shared test
cluster of ``bi_cluster``, the fuzz stores written into it, ``FEDERATOR_FUZZ_STATEMENTS``
statements (default 3,000) from seed ``FEDERATOR_FUZZ_SEED`` (default 14), the summary printed;
it exits 1 on a mismatch, 5xx or crash. ``load`` and ``fuzz`` serve a pytest run the same way.
"""

from __future__ import annotations

import re

import datetime as dt
import decimal
import itertools
import json
import math
import os
import random
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import duckdb
import pyarrow as pa
import urllib3

from tests.integration.changelog_util import produce, register

BASE_MS = 1_700_000_000_000
I64_MAX, I64_MIN = 2**63 - 1, -(2**63)

ITEMS_DEF = {
    "name": "fz_items", "type": "kv", "partitions": 4, "key": {"name": "id", "format": "long"},
    "value": {"format": "json", "fields": [
        {"name": "name", "type": "string"}, {"name": "qty", "type": "long"}, {"name": "price", "type": "double"},
        {"name": "flag", "type": "boolean"}, {"name": "ts", "type": "timestamp"}]},
}
NUMS_DEF = {"name": "fz_nums", "type": "kv", "partitions": 4, "key": {"name": "key", "format": "long"},
            "value": {"name": "value", "format": "long"}}

EDGES = [0, 1, -1, 2, -2, 7, 100, -100, 2**31 - 1, -(2**31), 2**31, 2**62, -(2**62), 2**62 + 1, I64_MAX, I64_MIN,
         I64_MAX - 1, I64_MIN + 1]


def items_rows(seed: int = 7) -> list[dict[str, Any]]:
    rnd = random.Random(seed)
    names = [None, "a", "b", "B", "", "Ünïcode ✓", "a b", "x%y_z", "it's", "a", "b", "zz"]
    qtys = [None, 0, 1, -1, 3, 7, 10, -100, 2**31, 2**62, -(2**62), I64_MAX, I64_MIN, 42, 5]
    prices = [None, 0.0, 1.5, -2.25, 100.0, 1e10, 0.1, 3.0, -7.5, 2.5]
    rows = []
    for i in range(48):
        rows.append({
            "id": i if i < 40 else rnd.choice([-5, -1_000_000, 2**40, 2**62, -(2**62), I64_MAX, I64_MIN, 10**12]) + i,
            "name": rnd.choice(names), "qty": rnd.choice(qtys), "price": rnd.choice(prices),
            "flag": rnd.choice([True, False, None]),
            "ts": rnd.choice([None, BASE_MS + rnd.randrange(0, 3 * 86_400_000)]),
        })
    # one id per row (the key); the generated extremes may collide with a small one
    seen, out = set(), []
    for r in rows:
        if r["id"] not in seen and I64_MIN <= r["id"] <= I64_MAX:
            seen.add(r["id"])
            out.append(r)
    return out


def nums_rows(seed: int = 11) -> list[dict[str, int]]:
    rnd = random.Random(seed)
    keys = list(dict.fromkeys(EDGES + [123456789, -987654321] + [rnd.randrange(-(2**62), 2**62) for _ in range(30)]))
    return [{"key": k, "value": rnd.choice(EDGES + [rnd.randrange(-1000, 1000) for _ in range(6)])} for k in keys]


def items_table(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.table({
        "id": pa.array([r["id"] for r in rows], pa.int64()),
        "name": pa.array([r["name"] for r in rows], pa.string()),
        "qty": pa.array([r["qty"] for r in rows], pa.int64()),
        "price": pa.array([r["price"] for r in rows], pa.float64()),
        "flag": pa.array([r["flag"] for r in rows], pa.bool_()),
        "ts": pa.array([None if r["ts"] is None else dt.datetime.fromtimestamp(r["ts"] / 1000, dt.timezone.utc)
                        for r in rows], pa.timestamp("ms", tz="UTC")),
    })


def nums_table(rows: list[dict[str, int]]) -> pa.Table:
    return pa.table({"key": pa.array([r["key"] for r in rows], pa.int64()),
                     "value": pa.array([r["value"] for r in rows], pa.int64())})


# ---------------------------------------------------------------------------------------------
# the generator

COLUMNS = {  # store -> type -> columns
    "fz_items": {"int": ["id", "qty"], "float": ["price"], "str": ["name"], "bool": ["flag"], "ts": ["ts"]},
    "fz_nums": {"int": ["key", "value"], "float": [], "str": [], "bool": [], "ts": []},
}
KEY = {"fz_items": "id", "fz_nums": "key"}
INT_LITS = ["0", "1", "2", "3", "-1", "7", "10", "100", "-7", "2147483647", "4611686018427387904",
            "9223372036854775807", "-9223372036854775807"]
FLOAT_LITS = ["1.5", "0.1", "-2.25", "0.0", "100.0", "1e300", "2.5"]
STR_LITS = ["'a'", "''", "'b'", "'B'", "'Ünïcode ✓'", "'a%'", "'it''s'", "'7'", "'-3'", "'x%y_z'", "' a '"]
TS_LITS = ["TIMESTAMP '2023-11-15 00:00:00'", "TIMESTAMPTZ '2023-11-16 12:00:00+00'"]


@dataclass
class Statement:
    sql: str
    params: list[Any] = field(default_factory=list)
    ordered: bool = False  # the ORDER BY makes the order total: compare rows in order


class Generator:
    def __init__(self, seed: int) -> None:
        self.r = random.Random(seed)

    def pick(self, options: list[Any]) -> Any:
        return self.r.choice(options)

    def chance(self, p: float) -> bool:
        return self.r.random() < p

    def col(self, store: str, kind: str) -> str | None:
        cols = COLUMNS[store][kind] if store else []
        return self.pick(cols) if cols else None

    # expressions of a type, over a store's columns ("" = no FROM)
    def expr(self, kind: str, store: str, depth: int = 0) -> str:
        leaf = depth >= 3 or self.chance(0.35 + 0.15 * depth)
        col = self.col(store, kind)
        if leaf:
            if col and self.chance(0.65):
                return col
            if self.chance(0.06):
                return "NULL"
            return {"int": lambda: self.pick(INT_LITS), "float": lambda: self.pick(FLOAT_LITS),
                    "str": lambda: self.pick(STR_LITS), "bool": lambda: self.pick(["TRUE", "FALSE"]),
                    "ts": lambda: self.pick(TS_LITS)}[kind]()
        return getattr(self, f"_{kind}")(store, depth + 1)

    def _int(self, s: str, d: int) -> str:
        e = self.expr
        return self.pick([
            lambda: f"({e('int', s, d)} {self.pick(['+', '-', '*', '//', '%'])} {e('int', s, d)})",
            lambda: f"(-{e('int', s, d)})",
            lambda: f"ABS({e('int', s, d)})",
            lambda: f"LENGTH({e('str', s, d)})",
            lambda: f"CAST({e('float', s, d)} AS BIGINT)",
            lambda: f"CAST({e('str', s, d)} AS BIGINT)",
            lambda: f"TRY_CAST({e('str', s, d)} AS BIGINT)",
            lambda: f"CAST({e('int', s, d)} AS INTEGER)",
            lambda: f"COALESCE({e('int', s, d)}, {e('int', s, d)})",
            lambda: f"CASE WHEN {e('bool', s, d)} THEN {e('int', s, d)} ELSE {e('int', s, d)} END",
            lambda: f"CASE {e('int', s, d)} WHEN {self.pick(INT_LITS)} THEN {e('int', s, d)} END",
            lambda: f"IF({e('bool', s, d)}, {e('int', s, d)}, {e('int', s, d)})",
            lambda: f"NULLIF({e('int', s, d)}, {self.pick(INT_LITS)})",
            lambda: f"GREATEST({e('int', s, d)}, {e('int', s, d)})",
        ])()

    def _float(self, s: str, d: int) -> str:
        e = self.expr
        num = lambda: e(self.pick(["int", "float"]), s, d)  # noqa: E731
        return self.pick([
            lambda: f"({e('float', s, d)} {self.pick(['+', '-', '*'])} {num()})",
            lambda: f"({num()} / {num()})",
            lambda: f"ABS({e('float', s, d)})",
            lambda: f"ROUND({num()})",
            lambda: f"ROUND({e('float', s, d)}, {self.pick(['0', '1', '2', '-1'])})",
            lambda: f"CAST({e('int', s, d)} AS DOUBLE)",
            lambda: f"TRY_CAST({e('str', s, d)} AS DOUBLE)",
            lambda: f"COALESCE({e('float', s, d)}, {self.pick(FLOAT_LITS)})",
            lambda: f"SQRT(ABS({e('float', s, d)}))",
        ])()

    def _str(self, s: str, d: int) -> str:
        e = self.expr
        return self.pick([
            lambda: f"UPPER({e('str', s, d)})",
            lambda: f"LOWER({e('str', s, d)})",
            lambda: f"SUBSTR({e('str', s, d)}, {self.pick(['1', '2', '0', '-1'])}, {self.pick(['1', '2', '3'])})",
            lambda: f"SUBSTRING({e('str', s, d)}, {self.pick(['1', '2'])})",
            lambda: f"({e('str', s, d)} || {e('str', s, d)})",
            lambda: f"CONCAT({e('str', s, d)}, {e('str', s, d)})",
            lambda: f"CAST({e('int', s, d)} AS VARCHAR)",
            lambda: f"CAST({e('bool', s, d)} AS VARCHAR)",
            lambda: f"COALESCE({e('str', s, d)}, {self.pick(STR_LITS)})",
            lambda: f"CASE WHEN {e('bool', s, d)} THEN {e('str', s, d)} ELSE {e('str', s, d)} END",
            lambda: f"REPLACE({e('str', s, d)}, 'a', 'A')",
            lambda: f"TRIM({e('str', s, d)})",
        ])()

    def _bool(self, s: str, d: int) -> str:
        e = self.expr
        kind = self.pick(["int", "int", "float", "str"] + (["ts"] if s == "fz_items" else []))
        cmp = self.pick(["=", "<>", "<", "<=", ">", ">="])
        return "(" + self.pick([  # parenthesized: DuckDB refuses a chained comparison (a = b = c)
            lambda: f"{e(kind, s, d)} {cmp} {e(kind, s, d)}",
            lambda: f"{e('int', s, d)} {cmp} {e('float', s, d)}",
            lambda: f"{e('bool', s, d)} {self.pick(['AND', 'OR'])} {e('bool', s, d)}",
            lambda: f"NOT {e('bool', s, d)}",
            lambda: f"{e(kind, s, d)} IS {self.pick(['', 'NOT '])}NULL",
            lambda: f"{e('int', s, d)} {self.pick(['', 'NOT '])}IN ({', '.join(self.r.sample(INT_LITS, 3))})",
            lambda: f"{e('str', s, d)} IN ({', '.join(self.r.sample(STR_LITS, 3))})",
            lambda: f"{e('int', s, d)} {self.pick(['', 'NOT '])}BETWEEN {self.pick(INT_LITS)} AND {self.pick(INT_LITS)}",
            lambda: f"{e('str', s, d)} {self.pick(['LIKE', 'NOT LIKE'])} {self.pick(['a%', '%b', '_', '%', 'x!%%'])!r}",
            lambda: f"{e('bool', s, d)} = {self.pick(['TRUE', 'FALSE'])}",
        ])() + ")"

    def _ts(self, s: str, d: int) -> str:
        return self.pick(COLUMNS[s]["ts"] or TS_LITS) if s else self.pick(TS_LITS)

    def aggregate(self, store: str) -> str:
        num = self.pick(["int", "int", "float"])
        anyk = self.pick(["int", "float", "str", "ts"] if store == "fz_items" else ["int"])
        return self.pick([
            lambda: "COUNT(*)",
            lambda: f"COUNT({self.expr(anyk, store, 1)})",
            lambda: f"COUNT(DISTINCT {self.expr(anyk, store, 2)})",
            lambda: "COUNT(DISTINCT NULL)",
            lambda: f"SUM({self.expr(num, store, 1)})",
            lambda: f"SUM(DISTINCT {self.expr(num, store, 2)})",
            lambda: f"AVG({self.expr(num, store, 1)})",
            lambda: f"MIN({self.expr(anyk, store, 1)})",
            lambda: f"MAX({self.expr(anyk, store, 1)})",
            lambda: self.pick(["SUM(NULL)", "AVG(DISTINCT NULL)", "MAX(NULL)"]),
            # a sum of integers is a HUGEINT, whose type these tell apart from a DECIMAL(38,0)
            lambda: f"SUM({self.expr('int', store, 1)}) {self.pick(['//', '%', '<<', '>>'])} {self.pick(['2', '3', '7'])}",
            # of a column: DuckDB never computes an aggregate only its type is asked of, so a value
            # error in its argument would fail the owners' states alone
            lambda: f"typeof({self.pick(['SUM', 'MIN', 'AVG', 'COUNT'])}({self.col(store, 'int')}))",
            lambda: f"hex(SUM({self.expr('int', store, 1)}))",
        ])()

    def output(self, expr: str, alias: str) -> str:
        """A select-list item: aliased, or named by DuckDB after its text (a unary + in it too)."""
        return self.pick([f"{expr} AS {alias}", f"{expr} AS {alias}", expr, f"+ {expr}", f"ALL + {expr}"
                          if alias == "c0" else expr])

    def any_expr(self, store: str) -> str:
        kinds = [k for k, cols in COLUMNS[store].items() if cols] if store else ["int", "float", "str", "bool"]
        return self.expr(self.pick(kinds), store)

    def where(self, store: str, p: float = 0.6) -> str:
        return f" WHERE {self.expr('bool', store, 1)}" if self.chance(p) else ""

    def statement(self) -> Statement:
        store = self.pick(["fz_items", "fz_items", "fz_nums"])
        shape = self.r.random()
        key = KEY[store]
        if shape < 0.25:  # a projection, maybe ordered and limited
            n = self.r.randint(1, 3)
            cols = ", ".join(self.output(self.any_expr(store), f"c{i}") for i in range(n))
            sql = f"SELECT {cols} FROM {store}{self.where(store)}"
            if self.chance(0.5):  # the key makes the order total
                order = f"{self.any_expr(store)}{self.pick(['', ' DESC'])}, {key}{self.pick(['', ' DESC'])}"
                sql += f" ORDER BY {order}"
                if self.chance(0.6):
                    sql += f" LIMIT {self.pick(['0', '1', '5', '100', '9223372036854775807'])}"
                    if self.chance(0.3):
                        sql += f" OFFSET {self.pick(['0', '2', '50'])}"
                return Statement(sql, ordered=True)
            return Statement(sql)
        if shape < 0.40:  # aggregates over the whole store
            aggs = ", ".join(self.aggregate(store) for _ in range(self.r.randint(1, 3)))
            return Statement(f"SELECT {aggs} FROM {store}{self.where(store)}")
        if shape < 0.62:  # GROUP BY
            g = self.pick(COLUMNS[store]["str"] + COLUMNS[store]["bool"] + COLUMNS[store]["int"]
                          + [f"({self.col(store, 'int')} % 3)"])
            aggs = ", ".join(self.aggregate(store) for _ in range(self.r.randint(1, 3)))
            sql = f"SELECT {g} AS g, {aggs} FROM {store}{self.where(store, 0.4)} GROUP BY {self.pick([g, '1'])}"
            if self.chance(0.3):
                sql += f" HAVING {self.pick(['COUNT(*) > 1', 'COUNT(*) = 1', f'MIN({key}) < 10'])}"
            if self.chance(0.5):
                sql += f" ORDER BY 1{self.pick(['', ' DESC'])}"
                if self.chance(0.5):
                    sql += f" LIMIT {self.pick(['1', '2', '10'])}"
                return Statement(sql, ordered=True)
            return Statement(sql)
        if shape < 0.70:  # DISTINCT
            return Statement(f"SELECT DISTINCT {self.any_expr(store)} AS d FROM {store}{self.where(store, 0.3)}")
        if shape < 0.85:  # key lookups and ranges, at the edges
            k = lambda: self.pick([str(v) for v in EDGES] + ["123456789", "5"])  # noqa: E731
            cond = self.pick([
                lambda: f"{key} = {k()}",
                lambda: f"{key} IN ({', '.join(k() for _ in range(self.r.randint(1, 4)))})",
                lambda: f"{key} BETWEEN {k()} AND {k()}",
                lambda: f"{key} {self.pick(['<', '<=', '>', '>='])} {k()}",
                lambda: f"{key} + {self.pick(['1', '-1'])} > 0",
                lambda: f"({key} >= {k()} AND {key} < {k()}) OR {key} = {k()}",
            ])()
            return Statement(f"SELECT * FROM {store} WHERE {cond}")
        if shape < 0.93:  # parameters
            value = self.pick([0, 1, -1, 2**62, I64_MAX, I64_MIN, "a", "", 1.5, None, True, 7])
            col = self.pick(COLUMNS[store]["int"] + COLUMNS[store]["str"])
            return Statement(f"SELECT {key}, ? AS p FROM {store} WHERE {col} = ? ORDER BY {key}",
                             [self.pick([1, "x", 2.5, None]), value], ordered=True)
        # no FROM: constant expressions
        n = self.r.randint(1, 3)
        return Statement("SELECT " + ", ".join(self.output(self.any_expr(''), f"c{i}") for i in range(n)))


def statements(seed: int, count: int) -> list[Statement]:
    g = Generator(seed)
    return [g.statement() for _ in range(count)]


# ---------------------------------------------------------------------------------------------
# comparing


def norm(v: Any) -> Any:
    """A value in a form both sides agree on: numbers as float or int (bools stay bools),
    timestamps in UTC, NaN as a marker."""
    if isinstance(v, decimal.Decimal):
        v = int(v) if v == v.to_integral_value() else float(v)
    if isinstance(v, float) and math.isnan(v):
        return "NaN"
    if isinstance(v, dt.datetime):
        return (v if v.tzinfo else v.replace(tzinfo=dt.timezone.utc)).astimezone(dt.timezone.utc)
    return v


def same_value(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if isinstance(a, int) and isinstance(b, int):
            return a == b
        return a == b or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


def _sort_key(row: tuple) -> tuple:
    out = []
    for v in row:
        if isinstance(v, bool):
            out.append((1, "bool", int(v)))
        elif isinstance(v, (int, float)):  # exact, not rounded: 2**62 and 2**62 + 1 are one float, 1e-11 and 1e-18 round alike
            out.append((1, "num", v))
        elif v is None:
            out.append((0, "", 0))
        else:
            out.append((1, type(v).__name__, str(v)))
    return tuple(out)


def same_rows(got: list[tuple], want: list[tuple], ordered: bool) -> bool:
    if len(got) != len(want) or any(len(a) != len(b) for a, b in zip(got, want)):
        return False
    if not ordered:
        got, want = sorted(got, key=_sort_key), sorted(want, key=_sort_key)
    return all(same_value(x, y) for a, b in zip(got, want) for x, y in zip(a, b))


def rows_of(table: pa.Table) -> list[tuple]:
    return [tuple(norm(v) for v in row.values()) for row in table.to_pylist()]


@dataclass
class Outcome:
    """One side's answer: rows, or an error (status and code for Federator)."""

    rows: list[tuple] | None = None
    columns: int = 0
    names: list[str] = field(default_factory=list)
    types: list[str] = field(default_factory=list)  # Arrow's
    status: int = 200
    code: str | None = None
    message: str = ""


def duck_outcome(db: duckdb.DuckDBPyConnection, stmt: Statement) -> Outcome:
    try:
        table = db.sql(stmt.sql, params=stmt.params or None).to_arrow_table()
    except duckdb.Error as e:
        return Outcome(status=0, code=type(e).__name__, message=str(e).splitlines()[0][:200])
    return answered(table)


def answered(table: pa.Table) -> Outcome:
    return Outcome(rows=rows_of(table), columns=table.num_columns, names=table.column_names,
                   types=[str(t) for t in table.schema.types])


def federator_outcome(status: int, data: bytes) -> Outcome:
    """From an HTTP answer to a request with ``"format": "arrow"``."""
    if status == 200:
        return answered(pa.ipc.open_stream(data).read_all())
    try:
        err = json.loads(data)["error"]
        return Outcome(status=status, code=err.get("code"), message=str(err.get("message"))[:300])
    except (ValueError, KeyError, TypeError):
        return Outcome(status=status, code=None, message=data[:300].decode("utf-8", "replace"))


# DuckDB's errors raised by a value (not by the SQL): division by zero, overflow, a failed CAST
_DATA_ERRORS = {"InvalidInputException", "OutOfRangeException", "ConversionException"}
_TOP_K = re.compile(r"\bORDER BY\b.*\bLIMIT\b", re.S | re.I)


def judge(stmt: Statement, fed: Outcome, duck: Outcome) -> str:
    if fed.status >= 500:
        return "5xx"
    if fed.rows is None:  # a 4xx
        if duck.rows is None:
            return "equal"
        return "unsupported" if fed.code == "UNSUPPORTED" or fed.status == 422 else "mismatch"
    if duck.rows is None and duck.code in _DATA_ERRORS and _TOP_K.search(stmt.sql):
        # DuckDB computes the select list for every row before its top-N and fails on a row the
        # LIMIT drops; Federator's owners cut each partition to its top rows first and compute
        # the select list on those. Counted apart, not as equal: the difference is documented.
        return "cut_by_limit"
    if duck.rows is None or (fed.names, fed.types) != (duck.names, duck.types):
        return "mismatch"  # other columns: their names or types
    return "equal" if same_rows(fed.rows, duck.rows, stmt.ordered) else "mismatch"


@dataclass
class Summary:
    counts: Counter = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)
    keep: int = 5

    def add(self, verdict: str, stmt: Statement, fed: Outcome | None, duck: Outcome | None) -> None:
        self.counts["statements"] += 1
        self.counts[verdict] += 1
        if verdict != "equal" and len(self.examples.setdefault(verdict, [])) < self.keep:
            self.examples[verdict].append(describe(stmt, fed, duck))

    def report(self) -> str:
        head = ", ".join(f"{k} {self.counts[k]}" for k in
                         ("statements", "equal", "mismatch", "unsupported", "cut_by_limit", "5xx", "crash"))
        lines = [f"fuzz: {head}"]
        for verdict, shown in self.examples.items():
            lines.append(f"  first {verdict}:")
            lines += [f"    {s}" for s in shown]
        return "\n".join(lines)


def _side(o: Outcome | None) -> str:
    if o is None:
        return "-"
    if o.rows is not None:
        rows = o.rows if len(o.rows) <= 4 else o.rows[:4] + ["..."]
        return f"{len(o.rows)} rows {rows} columns {list(zip(o.names, o.types))}"
    return f"{o.status or 'error'} {o.code}: {o.message}"


def describe(stmt: Statement, fed: Outcome | None, duck: Outcome | None) -> str:
    params = f" params={stmt.params!r}" if stmt.params else ""
    return f"{stmt.sql}{params}\n      federator: {_side(fed)}\n      duckdb:    {_side(duck)}"


def run(stmts: list[Statement], ask: Callable[[Statement], tuple[int, bytes]], db: duckdb.DuckDBPyConnection,
        alive: Callable[[], bool]) -> Summary:
    """Each statement to Federator (``ask`` gives status and body, or raises when there is no
    answer) and to DuckDB; stops at the first crash."""
    summary = Summary()
    for stmt in stmts:
        duck = duck_outcome(db, stmt)
        try:
            fed = federator_outcome(*ask(stmt))
        except Exception as e:  # noqa: BLE001 - no answer at all
            summary.add("crash", stmt, Outcome(status=0, code=type(e).__name__, message=str(e)[:200]), duck)
            break
        verdict = judge(stmt, fed, duck)
        if not alive():
            summary.add("crash", stmt, fed, duck)
            break
        summary.add(verdict, stmt, fed, duck)
    return summary


# ---------------------------------------------------------------------------------------------
# on a live cluster (the shared one of bi_cluster)

HTTP = urllib3.PoolManager()


def post(node: Any, body: dict, timeout: float = 60) -> urllib3.BaseHTTPResponse:
    return HTTP.request("POST", f"http://{node.endpoint}/v1/sql", body=json.dumps(body).encode(),
                        headers={"Content-Type": "application/json"}, timeout=timeout, retries=False)


def load(broker: Any, bi: Any) -> duckdb.DuckDBPyConnection:
    """The fuzz stores written through their changelogs into the cluster of ``bi`` (a
    ``BiCluster``), every row readable there; and the same rows in DuckDB."""
    items, nums = items_rows(), nums_rows()
    defs = [register(broker, bi.app_id, ITEMS_DEF), register(broker, bi.app_id, NUMS_DEF)]
    it, nu = defs
    produce(broker, it.topic, it.partitions, [
        (it.key.serialize(r["id"]), it.key.serialize(r["id"]),
         it.value.serialize({k: v for k, v in r.items() if k != "id"}), BASE_MS) for r in items])
    produce(broker, nu.topic, nu.partitions, [
        (nu.key.serialize(r["key"]),) * 2 + (nu.value.serialize(r["value"]), BASE_MS) for r in nums])
    for d, rows in zip(defs, (items, nums)):
        bi.cluster.wait_settled(d.name, d.partitions, timeout=60)
        deadline = time.monotonic() + 30
        while json.loads(post(bi.nodes[0], {"sql": f"SELECT COUNT(*) FROM {d.name}"}).data).get("rows") != [[len(rows)]]:
            assert time.monotonic() < deadline, f"{d.name} never showed its {len(rows)} rows"
            time.sleep(0.2)
    db = duckdb.connect()
    db.execute("SET TimeZone = 'UTC'")
    db.register(it.name, items_table(items))
    db.register(nu.name, nums_table(nums))
    return db


def fuzz(bi: Any, db: duckdb.DuckDBPyConnection, count: int, seed: int) -> tuple[Summary, str]:
    """``count`` statements from ``seed``, sent round-robin to the nodes; the summary and its report."""
    nodes = itertools.cycle(bi.nodes)

    def ask(stmt: Statement) -> tuple[int, bytes]:
        resp = post(next(nodes), {"sql": stmt.sql, "parameters": stmt.params, "format": "arrow", "timeout_ms": 30_000})
        return resp.status, resp.data

    def alive() -> bool:
        return all(n.proc is not None and n.proc.poll() is None for n in bi.nodes)

    started = time.monotonic()
    summary = run(statements(seed, count), ask, db, alive)
    if not alive() and not summary.counts["crash"]:
        summary.counts["crash"] += 1
    return summary, f"{summary.report()}\n  seed {seed}, {time.monotonic() - started:.1f} s"


def main() -> int:
    from tests.conftest import RunningBroker, free_port
    from tests.integration.bi_cluster import start

    count = int(os.environ.get("FEDERATOR_FUZZ_STATEMENTS", "3000"))
    seed = int(os.environ.get("FEDERATOR_FUZZ_SEED", "14"))
    root = Path(tempfile.mkdtemp(prefix="federator-fuzz-"))
    broker = RunningBroker(free_port(), root / "broker.log")
    try:
        bi = start(broker, root)
        try:
            summary, report = fuzz(bi, load(broker, bi), count, seed)
        finally:
            bi.cluster.stop()
    finally:
        broker.stop()
    print(report)
    return 1 if summary.counts["mismatch"] or summary.counts["5xx"] or summary.counts["crash"] else 0


if __name__ == "__main__":
    sys.exit(main())
