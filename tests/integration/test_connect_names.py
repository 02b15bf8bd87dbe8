"""A store under every form of its name, through every front door: HTTP, the Postgres protocol
(simple and extended), Flight SQL and the DB-API driver, on the shared ``bi_cluster``.

The same statement, its stores written bare, schema-qualified (``main``, ``public``),
database-qualified and quoted, must give DuckDB's rows over the stores; a name that is no
store's is an error on every door, never an empty answer. The module sorts before
test_connect_postgres.py, so the two share one cluster.
"""

from __future__ import annotations

import json
from typing import Callable

import adbc_driver_flightsql.dbapi as flightsql
import pytest

import federator.dbapi as dbapi
from tests.integration.bi_cluster import BiCluster, bi_cluster  # noqa: F401 - bi_cluster is a fixture
from tests.integration.test_sql import norm, post, sort_key

psycopg = pytest.importorskip("psycopg")

FORMS = ["{}", "main.{}", "public.{}", 'MAIN."{}"', '"public"."{}"', "federator.main.{}", '"federator"."public"."{}"']
# {p} and {m}: the players and per_minute stores; qualified columns, a join, a subquery, a CTE
STATEMENTS = [
    "SELECT team, count(*) AS n, sum(games) AS g FROM {p} WHERE games > 10 GROUP BY team",
    "SELECT {p}.player, m.points FROM {p} JOIN {m} m ON m.player = {p}.player WHERE m.points > 10",
    "WITH top AS (SELECT player, sum(points) AS s FROM {m} GROUP BY player) "
    "SELECT count(*) AS n FROM {p} WHERE player IN (SELECT player FROM top WHERE s > 40)",
    "SELECT player FROM {p} WHERE player = 'p007'",  # a point lookup
]


def _http(c: BiCluster, sql: str) -> list[tuple]:
    resp = post(c.nodes[0], {"sql": sql})
    assert resp.status == 200, resp.data[:300]

    return [tuple(r) for r in json.loads(resp.data)["rows"]]


def _pg(prepare: bool | None) -> Callable[[BiCluster, str], list[tuple]]:
    def run(c: BiCluster, sql: str) -> list[tuple]:
        with psycopg.connect(f"host=127.0.0.1 port={c.nodes[1].pg_port} dbname=federator user=tester",
                             autocommit=True) as conn:
            # no parameters and no prepare: psycopg sends the simple protocol; prepare: Parse/Bind/Execute
            return conn.execute(sql, prepare=prepare).fetchall()
    return run


def _flight(c: BiCluster, sql: str) -> list[tuple]:
    with flightsql.connect(f"grpc://127.0.0.1:{c.nodes[2].flight_port}") as conn, conn.cursor() as cur:
        cur.execute(sql)
        return cur.fetchall()


def _dbapi(c: BiCluster, sql: str) -> list[tuple]:
    cur = dbapi.connect(c.url()).cursor()
    cur.execute(sql)
    return cur.fetchall()


DOORS = {"HTTP": _http, "Postgres simple": _pg(None), "Postgres extended": _pg(True), "Flight SQL": _flight,
         "DB-API": _dbapi}


def bag(rows: list[tuple]) -> list[tuple]:
    """The rows as a multiset, their values as test_sql.py compares them."""
    return sorted((tuple(norm(v) for v in r) for r in rows), key=sort_key)


@pytest.mark.parametrize("door", DOORS)
def test_every_form_of_a_name_reads_the_store(bi_cluster, door) -> None:
    c, run = bi_cluster, DOORS[door]
    for template in STATEMENTS:
        want = bag(c.db.execute(template.format(p="players", m="per_minute")).fetchall())
        assert want
        for form in FORMS:
            sql = template.format(p=form.format("players"), m=form.format("per_minute"))
            assert bag(run(c, sql)) == want, sql


@pytest.mark.parametrize("door", DOORS)
@pytest.mark.parametrize("name", ["no_such_store", "public.no_such_store", "main.pg_class", "other.players",
                                  "federator.other.players", "otherdb.public.players", "information_schema.players"])
def test_a_name_that_is_no_store_is_an_error_not_an_empty_answer(bi_cluster, door, name) -> None:
    with pytest.raises(Exception) as e:
        DOORS[door](bi_cluster, f"SELECT count(*) FROM {name}")
    assert any(part in str(e.value) for part in name.split(".")), e.value  # it says which name


def test_a_statement_of_stores_and_the_catalog_reads_the_stores(bi_cluster) -> None:
    c = bi_cluster
    sql = ("SELECT c.relname, count(*) AS n, sum(p.games) AS g FROM pg_catalog.pg_class c "
           "JOIN public.players p ON c.relname = 'players' WHERE p.games > 10 GROUP BY c.relname")
    want = c.db.execute("SELECT 'players', count(*), sum(games) FROM players WHERE games > 10").fetchall()
    for prepare in (None, True):
        assert bag(_pg(prepare)(c, sql)) == bag(want)
