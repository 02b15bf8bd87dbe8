"""The receiver's last step in Arrow (federator.sql.finish): a top-k cut and a merge of
partial states answer exactly what DuckDB answers for the same statement over the same rows,
and decline (None: DuckDB runs it) where they could not."""

from __future__ import annotations

import datetime as dt
import decimal

import duckdb
import pyarrow as pa
import sqlglot
from hypothesis import given, strategies as st

from federator.query.rows import Rows
from federator.sql.finish import MergeStates, TopRows, merge_states, top_rows

COLUMNS = {
    "i": (pa.int64(), st.integers(-5, 5)),
    "s": (pa.large_string(), st.sampled_from(["", "a", "B", "b", "é", "z\u00e9", "\U0001f600"])),
    "b": (pa.bool_(), st.booleans()),
    "d": (pa.decimal128(12, 3), st.decimals(-100, 100, places=3, allow_nan=False, allow_infinity=False)),
    "t": (pa.timestamp("ms", tz="UTC"),
          st.datetimes(dt.datetime(2024, 1, 1), dt.datetime(2024, 1, 3), timezones=st.just(dt.timezone.utc))),
}


def duckdb_answer(sql: str, relation: pa.Table) -> pa.Table:
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    con.register("r0", relation)
    return con.sql(sql).to_arrow_table()


@st.composite
def tables(draw) -> pa.Table:
    n = draw(st.integers(0, 12))
    data = {"id": pa.array(range(n), pa.int64())}
    for name, (typ, values) in COLUMNS.items():
        data[name] = pa.array([draw(st.one_of(st.none(), values)) for _ in range(n)], typ)
    return pa.table(data)


@st.composite
def top_k_statements(draw) -> str:
    keys = draw(st.lists(st.sampled_from(list(COLUMNS)), min_size=0, max_size=3, unique=True))
    order = [f"{k}{draw(st.sampled_from(['', ' DESC']))}{draw(st.sampled_from(['', ' NULLS FIRST', ' NULLS LAST']))}"
             for k in keys]
    picked = draw(st.sampled_from(["*", "i", "id, s", "s AS name, i, id", "r0.t, id", "i AS s, s AS i, id, b AS d"]))
    sql = f"SELECT {picked} FROM r0 ORDER BY {', '.join(order + ['id'])}"  # id last: a total order
    if draw(st.booleans()):
        sql += f" LIMIT {draw(st.integers(0, 14))}"
        if draw(st.booleans()):
            sql += f" OFFSET {draw(st.integers(0, 14))}"
    return sql


@given(tables(), top_k_statements())
def test_a_top_k_cut_equals_duckdb(rows, sql) -> None:
    finish = top_rows(sqlglot.parse_one(sql, read="duckdb"), "r0")
    assert finish is not None, sql
    want = duckdb_answer(sql, rows)
    got = finish.apply(rows, want.schema)  # as planned for a store: DuckDB's answer schema
    assert got is not None and got.schema == want.schema and got.to_pylist() == want.to_pylist(), sql
    # a rule's rows have no planned schema: timestamps are left to DuckDB, which changes their unit
    bare = finish.apply(rows, None)
    if any(pa.types.is_timestamp(t) for t in want.schema.types):
        assert bare is None, sql
    else:
        assert bare is not None and bare.equals(want), sql


@given(tables(), top_k_statements())
def test_a_top_k_cut_of_python_values_equals_duckdb(rows, sql) -> None:
    """A global store's few rows come as Python values (Rows): cut in Python where the columns
    already have the answer's types, and the same answer as DuckDB's either way."""
    rows = rows.cast(pa.schema([f.with_type(pa.string()) if f.name == "s" else f for f in rows.schema]))
    finish = top_rows(sqlglot.parse_one(sql, read="duckdb"), "r0")
    assert finish is not None, sql
    want = duckdb_answer(sql, rows)
    got = finish.apply(python_rows(rows), want.schema)
    picked = [rows.schema.field(c).type for c, _ in finish.columns or [(n, n) for n in rows.column_names]]
    assert isinstance(got, Rows) == (picked == want.schema.types), sql  # Arrow only for a cast
    table = got.to_table() if isinstance(got, Rows) else got
    assert table is not None and table.schema == want.schema and table.to_pylist() == want.to_pylist(), sql


def python_rows(table: pa.Table) -> Rows:
    """The table's rows as a together handler gives them: timestamps as integers of their unit."""
    columns = [c.cast(pa.int64()) if pa.types.is_timestamp(c.type) else c for c in table.columns]
    return Rows(table.schema, list(zip(*(c.to_pylist() for c in columns))) if table.num_rows else [])


@given(tables(), st.sampled_from(["i", "s", "b", "d", "t"]))
def test_a_merge_of_states_equals_duckdb(states, column) -> None:
    sql = (f'SELECT CAST(COALESCE(SUM("id"), 0) AS BIGINT) AS n, MIN("{column}") AS lo, MAX("{column}") AS hi'
           + (f', SUM("{column}") AS total' if column in ("i", "d") else "") + " FROM r0")
    items = [("n", "count", "id"), ("lo", "min", column), ("hi", "max", column)]
    if column in ("i", "d"):
        items.append(("total", "sum", column))
    want = duckdb_answer(sql, states)
    got = MergeStates(tuple(items)).apply(states, want.schema)
    assert got is not None and got.equals(want), sql


@given(tables(), st.lists(st.sampled_from(["i", "s", "b"]), min_size=1, max_size=2, unique=True),
       st.sampled_from(["", " DESC"]), st.sampled_from(["", " NULLS FIRST"]), st.one_of(st.none(), st.integers(0, 6)))
def test_a_merge_of_grouped_states_equals_duckdb(states, keys, desc, nulls, limit) -> None:
    states = states.rename_columns([f"__g{c}" if c in keys else f"__a{c}" for c in states.column_names])
    group = ", ".join(f'"__g{k}"' for k in keys)
    sql = (f'SELECT {", ".join(f"{chr(34)}__g{k}{chr(34)} AS {chr(34)}{k}{chr(34)}" for k in keys)}, '
           'CAST(COALESCE(SUM("__aid"), 0) AS BIGINT) AS "n", SUM("__ad") AS "total", MIN("__at") AS "first" '
           f'FROM r0 GROUP BY {group} ORDER BY {", ".join(f"{chr(34)}{k}{chr(34)}{desc}{nulls}" for k in keys)}'
           + (f" LIMIT {limit}" if limit is not None else ""))
    finish = merge_states(sqlglot.parse_one(sql, read="duckdb"), "r0")
    assert finish is not None, sql
    want = duckdb_answer(sql, states)
    got = finish.apply(states, want.schema)
    assert got is not None and got.schema == want.schema and got.to_pylist() == want.to_pylist(), sql


def test_statements_that_do_more_than_a_cut_are_left_to_duckdb() -> None:
    for sql in ["SELECT i + 1 FROM r0 ORDER BY i LIMIT 2", "SELECT i FROM r0 WHERE i > 1 ORDER BY i",
                "SELECT DISTINCT i FROM r0 ORDER BY i", "SELECT i FROM r0 ORDER BY i + 1 LIMIT 1",
                "SELECT i AS s, s AS s FROM r0 ORDER BY s", "SELECT i FROM r0 JOIN r1 ON true ORDER BY i",
                "SELECT i FROM other ORDER BY i", "SELECT i FROM r0 ORDER BY i LIMIT (SELECT 1)"]:
        assert top_rows(sqlglot.parse_one(sql, read="duckdb"), "r0") is None, sql


def test_floats_and_overflows_are_left_to_duckdb() -> None:
    rows = pa.table({"f": pa.array([1.5, float("nan"), None]), "id": pa.array([1, 2, 3])})
    assert TopRows(None, (("f", True, False),), 2, 0).apply(rows, None) is None  # NaN sorts first in DuckDB
    states = pa.table({"f": pa.array([0.1, 0.2, 0.3])})
    assert MergeStates((("s", "sum", "f"),)).apply(states, pa.schema([("s", pa.float64())])) is None
    big = pa.table({"h": pa.array([decimal.Decimal(9 * 10**37)] * 2, pa.decimal128(38, 0))})
    assert MergeStates((("s", "sum", "h"),)).apply(big, pa.schema([("s", pa.decimal128(38, 0))])) is None
