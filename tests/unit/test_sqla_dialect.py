"""The SQLAlchemy dialect without a cluster: URLs, entry points, compiled SQL, types, Superset grains."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import Column, DateTime, Integer, MetaData, String, Table, cast, create_engine, func, select
from sqlalchemy import types as sqltypes

from federator.sqla.dialect import FederatorDialect, FederatorHTTPSDialect
from federator.sqla.superset import FederatorEngineSpec
from federator.sqla.types import resolve_type


def test_urls_resolve_through_the_entry_points() -> None:
    assert type(create_engine("federator://h:1").dialect) is FederatorDialect
    assert type(create_engine("federator+http://h:1").dialect) is FederatorDialect
    assert type(create_engine("federator+https://h:1").dialect) is FederatorHTTPSDialect


@pytest.mark.parametrize(("url", "args", "kwargs"), [
    ("federator://h:1", ["http://h:1"], {}),
    ("federator://h", ["http://h:8080"], {}),
    ("federator+https://h:1?verify=false", ["https://h:1"], {"verify": False}),
    ("federator+https://h:1?verify=/etc/ca.pem", ["https://h:1"], {"verify": "/etc/ca.pem"}),
    ("federator://h:1?hosts=g:2,k:3&timeout=2.5&allow_stale=true&max_lag=10&token=abc",
     ["http://h:1,g:2,k:3"], {"timeout": 2.5, "allow_stale": True, "max_lag": 10, "token": "abc"}),
])
def test_connect_args_from_the_url(url, args, kwargs) -> None:
    engine = create_engine(url)
    assert engine.dialect.create_connect_args(engine.url) == (args, kwargs)


def test_unknown_url_options_are_refused() -> None:
    with pytest.raises(ValueError, match="alow_stale"):
        create_engine("federator://h:1?alow_stale=true")


def _sql(stmt, **kw) -> str:
    return " ".join(str(stmt.compile(dialect=FederatorDialect(), **kw)).split())


PLAYERS = Table("players", MetaData(), Column("player", String, primary_key=True), Column("games", Integer),
                Column("seen", DateTime(timezone=True)))


def test_compiled_sql_is_what_the_service_takes() -> None:
    t = PLAYERS
    q = select(t.c.player).where(t.c.player == "x").order_by(t.c.games.desc()).limit(5).offset(2)
    assert _sql(q) == ("SELECT players.player FROM players WHERE players.player = ? "
                       "ORDER BY players.games DESC LIMIT ? OFFSET ?")
    assert _sql(select(t.c.player).offset(3)) == "SELECT players.player FROM players OFFSET ?"  # no LIMIT -1
    assert _sql(select(func.count()).select_from(t)) == "SELECT count(*) AS count_1 FROM players"
    assert _sql(select(cast(t.c.games, sqltypes.Float), cast(t.c.player, String(20)))) == (
        "SELECT CAST(players.games AS DOUBLE) AS games, CAST(players.player AS VARCHAR) AS player FROM players")


def test_literal_binds_render_literals_the_service_parses() -> None:
    t = PLAYERS
    q = select(t.c.player).where(t.c.seen >= dt.datetime(2024, 5, 1, 12, tzinfo=dt.timezone.utc), t.c.player == "o'k")
    assert _sql(q, compile_kwargs={"literal_binds": True}) == (
        "SELECT players.player FROM players WHERE players.seen >= TIMESTAMP '2024-05-01 12:00:00+00:00' "
        "AND players.player = 'o''k'")


@pytest.mark.parametrize(("name", "want"), [
    ("VARCHAR", sqltypes.String), ("BIGINT", sqltypes.BigInteger), ("INTEGER", sqltypes.Integer),
    ("DOUBLE", sqltypes.Float), ("BOOLEAN", sqltypes.Boolean), ("BLOB", sqltypes.LargeBinary),
    ("TIMESTAMP", sqltypes.DateTime), ("DATE", sqltypes.Date), ("DECIMAL(10,2)", sqltypes.Numeric),
    ("VARCHAR[]", sqltypes.NullType),
])
def test_service_type_names_map_to_sqlalchemy_types(name, want) -> None:
    assert isinstance(resolve_type(name), want)
    tz = resolve_type("TIMESTAMP WITH TIME ZONE")
    assert isinstance(tz, sqltypes.DateTime) and tz.timezone


def test_superset_spec_imports_without_superset() -> None:
    grains = FederatorEngineSpec._time_grain_expressions
    # every grain Superset names (superset.db_engine_specs.base.builtin_time_grains), and None
    assert {None, "PT1S", "PT5S", "PT30S", "PT1M", "PT5M", "PT10M", "PT15M", "PT30M", "PT1H", "PT6H", "P1D", "P1W",
            "1969-12-28T00:00:00Z/P1W", "1969-12-29T00:00:00Z/P1W", "P1W/1970-01-03T00:00:00Z",
            "P1W/1970-01-04T00:00:00Z", "P1M", "P3M", "P1Y"} == set(grains)
    assert all("{col}" in e for e in grains.values())
    assert FederatorEngineSpec.convert_dttm("TIMESTAMP WITH TIME ZONE", dt.datetime(2024, 5, 1, 12)) == (
        "TIMESTAMP '2024-05-01 12:00:00.000000'")
    assert FederatorEngineSpec.convert_dttm("VARCHAR", dt.datetime(2024, 5, 1)) is None
