"""The SQLAlchemy dialect and pandas against a live three-node cluster, compared with /v1/sql and DuckDB."""

from __future__ import annotations

import datetime as dt
import json
import math

import pandas as pd
import pytest
import urllib3
from sqlalchemy import MetaData, Table, create_engine, func, inspect, literal_column, select, table
from sqlalchemy import types as sqltypes

from federator.sqla.superset import FederatorEngineSpec
from tests.integration.bi_cluster import bi_cluster  # noqa: F401 - a fixture

pytestmark = pytest.mark.integration


def engine_for(c):
    first, *rest = c.nodes
    return create_engine(f"federator://{first.endpoint}?hosts={','.join(n.endpoint for n in rest)}&timeout=10")


def plain(v):
    """pandas' and Python's spellings of one value, made comparable."""
    if v is None or v is pd.NaT or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
        return None
    if isinstance(v, pd.Timestamp):
        v = v.to_pydatetime()
    if isinstance(v, dt.datetime):
        return v.astimezone(dt.timezone.utc)
    if isinstance(v, float) and v.is_integer():
        return int(v)  # an integer column with NULLs is float64 in pandas
    return v


def records(df: pd.DataFrame) -> list[tuple]:
    return [tuple(plain(v) for v in row) for row in df.astype(object).itertuples(index=False)]


def v1_sql_json(node, sql: str) -> dict:
    resp = urllib3.request("POST", f"http://{node.endpoint}/v1/sql", body=json.dumps({"sql": sql}).encode(),
                           headers={"Content-Type": "application/json"})
    assert resp.status == 200, resp.data[:300]
    return json.loads(resp.data)


def from_json(value, type_name: str):
    if value is not None and type_name.startswith("TIMESTAMP"):
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    return plain(value)


def test_the_inspector_lists_stores_and_columns(bi_cluster) -> None:
    insp = inspect(engine_for(bi_cluster))
    assert insp.get_schema_names() == ["main"]
    assert insp.get_table_names() == ["blobs", "per_minute", "players"]
    assert insp.has_table("players") and not insp.has_table("nowhere")
    cols = {c["name"]: c for c in insp.get_columns("players")}
    assert list(cols) == ["player", "team", "games", "score", "active", "last_seen", "rowtime"]
    kinds = {n: type(c["type"]) for n, c in cols.items()}
    assert issubclass(kinds["player"], sqltypes.String) and issubclass(kinds["games"], sqltypes.BigInteger)
    assert issubclass(kinds["score"], sqltypes.Float) and issubclass(kinds["active"], sqltypes.Boolean)
    assert issubclass(kinds["last_seen"], sqltypes.DateTime) and cols["last_seen"]["type"].timezone
    assert not cols["player"]["nullable"] and cols["team"]["nullable"]
    assert insp.get_pk_constraint("players")["constrained_columns"] == ["player"]
    assert insp.get_pk_constraint("per_minute")["constrained_columns"] == ["player"]
    blobs = {c["name"]: type(c["type"]) for c in insp.get_columns("blobs")}
    assert issubclass(blobs["id"], sqltypes.Integer) and issubclass(blobs["payload"], sqltypes.LargeBinary)
    assert [c["name"] for c in insp.get_columns("per_minute")] == ["player", "window_start", "window_end", "points", "rowtime"]
    assert insp.get_foreign_keys("players") == [] and insp.get_indexes("players") == []


def test_core_select_with_where_order_by_limit(bi_cluster) -> None:
    c = bi_cluster
    engine = engine_for(c)
    players = Table("players", MetaData(), autoload_with=engine)
    with engine.connect() as conn:
        row = conn.execute(select(players).where(players.c.player == "p003")).one()
        want = c.db.execute("SELECT player, team, games, score, active, last_seen FROM players "
                            "WHERE player = 'p003'").fetchone()
        assert tuple(plain(v) for v in row[:6]) == tuple(plain(v) for v in want)
        q = (select(players.c.player, players.c.score).where(players.c.score > 10, players.c.team.is_not(None))
             .order_by(players.c.score.desc(), players.c.player).limit(4).offset(1))
        got = [tuple(r) for r in conn.execute(q)]
        assert got == [tuple(r) for r in c.db.execute(
            "SELECT player, score FROM players WHERE score > 10 AND team IS NOT NULL "
            "ORDER BY score DESC, player LIMIT 4 OFFSET 1").fetchall()]
        counts = conn.execute(select(players.c.team, func.count().label("n")).group_by(players.c.team)
                              .order_by(players.c.team)).all()
        assert [tuple(r) for r in counts] == [tuple(r) for r in c.db.execute(
            "SELECT team, COUNT(*) AS n FROM players GROUP BY team ORDER BY team NULLS LAST").fetchall()]
        in_list = conn.execute(select(players.c.player).where(players.c.player.in_(["p001", "p002", "zz"]))
                               .order_by(players.c.player)).scalars().all()
        assert in_list == ["p001", "p002"]
    blobs = Table("blobs", MetaData(), autoload_with=engine, schema="main")  # as Superset names it
    with engine.connect() as conn:
        assert conn.execute(select(blobs.c.payload).where(blobs.c.id == 4)).scalar_one() == \
            next(r["payload"] for r in c.blobs if r["id"] == 4)


SQL = "SELECT player, team, games, score, active, last_seen FROM players ORDER BY player"


def test_pandas_read_sql_equals_v1_sql_and_duckdb(bi_cluster) -> None:
    c = bi_cluster
    df = pd.read_sql(SQL, engine_for(c))
    assert list(df.columns) == ["player", "team", "games", "score", "active", "last_seen"]
    assert str(df["last_seen"].dtype) == "datetime64[ns, UTC]"
    body = v1_sql_json(c.nodes[1], SQL)
    types = [col["type"] for col in body["columns"]]
    assert records(df) == [tuple(from_json(v, t) for v, t in zip(row, types)) for row in body["rows"]]
    assert records(df) == records(c.db.execute(SQL).df())
    one = pd.read_sql("SELECT player, games FROM players WHERE player = ?", engine_for(c), params=("p006",))
    assert records(one) == [("p006", 18)]
    joined = ("SELECT p.player, p.team, SUM(m.points) AS points FROM players p JOIN per_minute m ON m.player = p.player "
              "GROUP BY p.player, p.team ORDER BY points DESC, p.player LIMIT 20")
    assert records(pd.read_sql(joined, engine_for(c))) == records(c.db.execute(joined).df())


GRAFANA = [
    # $__timeGroupAlias(last_seen, 1h) and $__timeFilter(last_seen) as Grafana's Postgres source expands them
    'SELECT floor(extract(epoch from last_seen)/3600)*3600 AS "time", count(*) AS "value" FROM players '
    "WHERE last_seen BETWEEN '1970-01-01T00:00:00Z' AND '2100-01-01T00:00:00Z' GROUP BY 1 ORDER BY 1",
    'SELECT window_start AS "time", player AS metric, SUM(points) AS value FROM per_minute '
    "WHERE window_start >= TIMESTAMPTZ '1970-01-01 00:00:00+00' GROUP BY 1, 2 ORDER BY 1, 2",
]


@pytest.mark.parametrize("sql", GRAFANA)
def test_grafana_time_series_queries_equal_duckdb(bi_cluster, sql) -> None:
    c = bi_cluster
    body = v1_sql_json(c.nodes[0], sql)
    types = [col["type"] for col in body["columns"]]
    got = [tuple(from_json(v, t) for v, t in zip(row, types)) for row in body["rows"]]
    assert got == records(c.db.execute(sql).df())


GRAINS = [("PT1S", "second"), ("PT1M", "minute"), ("PT1H", "hour"), ("P1D", "day"), ("P1W", "week"),
          ("P1M", "month"), ("P3M", "quarter"), ("P1Y", "year")]


@pytest.mark.parametrize(("grain", "unit"), GRAINS)
@pytest.mark.parametrize(("store", "column", "measure"), [("per_minute", "window_start", "SUM(points)"),
                                                         ("players", "last_seen", "COUNT(*)")])
def test_superset_time_grains_equal_duckdb(bi_cluster, grain, unit, store, column, measure) -> None:
    """Each grain expression of the engine spec, run by the service, groups as DuckDB's date_trunc."""
    c = bi_cluster
    expr = literal_column(FederatorEngineSpec._time_grain_expressions[grain].format(col=column))
    q = select(expr.label("t"), literal_column(measure).label("m")).select_from(table(store)).group_by(expr).order_by(expr)
    with engine_for(c).connect() as conn:
        got = [(plain(t), m) for t, m in conn.execute(q)]
    want = c.db.execute(f"SELECT date_trunc('{unit}', {column}) AS t, {measure} FROM {store} GROUP BY 1 ORDER BY 1").fetchall()
    assert got == [(plain(t), m) for t, m in want]
