"""The SQL engine (federator.sql.engine.SqlEngine) in one process: nodes whose shards are
dicts (tests/unit/memory_cluster.py), the real owner code, routing, dispatch and DuckDB.

The contract: a statement is answered exactly as DuckDB answers it over the whole tables, so
every answer here is compared with DuckDB run directly over the same rows. Around it: the
point lookup reads in-process and dispatches nothing, work is pushed to the owners, the
consistency token is the positions the owners answered at, a token from the future waits
for them and then fails, answers over unchanged positions are reused, and the errors a
user gets when a store or a partition or the time is missing. tests/integration/test_sql.py
checks the same behaviours over real clusters.
"""

from __future__ import annotations

import asyncio
import decimal
import math
import random
import time
from typing import Any, Iterator

import duckdb
import pyarrow as pa
import pytest
import sqlglot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlglot import exp

from federator.catalog.definition import StoreDefinition
from federator.errors import SqlError
from federator.owner.duck import Duck, DuckConfig
from federator.partitioner import partition_for
from federator.query.position import Position
from federator.query.queries import KeyQuery, KeysQuery, RangeQuery
from federator.sql.engine import RoutedPoint, SqlEngine
from federator.sql.result import SqlRequest, SqlResult
from tests.registry import REGISTRY
from tests.unit.memory_cluster import MemoryCluster

P = 4
BASE = 1_700_000_000_000

PLAYERS = {"name": "players", "type": "kv", "topic": "app-players-changelog", "partitions": P,
           "key": {"name": "player", "format": "string"},
           "value": {"format": "json", "fields": [
               {"name": "team", "type": "string"}, {"name": "games", "type": "long"},
               {"name": "total_score", "type": "long"}, {"name": "best", "type": "double"},
               {"name": "active", "type": "boolean"}, {"name": "last_seen", "type": "timestamp"}]}}
SCORES = {"name": "scores", "type": "kv", "topic": "app-scores-changelog", "partitions": P,
          "key": {"name": "key", "format": "long"}, "value": {"name": "score", "format": "double"}}
# co-partitioned with players: same partition count, same key format
BONUS = {"name": "bonus", "type": "kv", "topic": "app-bonus-changelog", "partitions": P,
         "key": {"name": "player", "format": "string"}, "value": {"name": "bonus", "format": "long"}}


def definitions() -> list[StoreDefinition]:
    return [StoreDefinition.from_dict(d, REGISTRY) for d in (PLAYERS, SCORES, BONUS)]


class World:
    """A cluster and the same rows as plain tables for DuckDB: ``put`` writes both."""

    def __init__(self, duck: Duck, node_ids: tuple[str, ...] = ("me",), unowned: frozenset[int] = frozenset()) -> None:
        self.cluster = MemoryCluster(definitions(), duck, node_ids, unowned)
        self.rows: dict[str, dict[Any, dict[str, Any]]] = {name: {} for name in self.cluster.stores}
        self._db: duckdb.DuckDBPyConnection | None = None
        rnd = random.Random(7)
        for i in range(120):
            self.put("players", f"p{i:04d}", {
                "team": rnd.choice(["red", "blue", "green", None]),
                "games": rnd.choice([None, rnd.randrange(0, 30)]),
                "total_score": rnd.randrange(-500, 5000),
                "best": rnd.choice([None, round(rnd.uniform(-10, 100), 3)]),
                "active": rnd.choice([True, False, None]),
                "last_seen": BASE + rnd.randrange(0, 86_400_000)})
        for k in range(-60, 60, 3):
            self.put("scores", k, k * 1.5)
        for i in range(0, 140, 2):  # half the players, and some that are not
            self.put("bonus", f"p{i:04d}", i % 13)

    def put(self, store: str, key: Any, value: Any) -> int:
        """``key``'s new value in the store and in DuckDB's copy; the partition it went to."""
        defn = self.cluster.stores[store]
        row = dict(value) if isinstance(value, dict) else {defn.value_name: value}
        self.rows[store][key] = {defn.key_name: key, **row}
        self._db = None  # DuckDB's copy is made again
        return self.cluster.write(store, key, value)

    def duckdb(self, sql: str, params: list | None = None) -> pa.Table:
        """DuckDB's own answer over the whole tables."""
        if self._db is None:
            self._db = duckdb.connect()
            self._db.execute("SET TimeZone = 'UTC'")
            for name, rows in self.rows.items():
                schema = pa.schema([f for f in self.cluster.stores[name].arrow_schema() if f.name != "rowtime"])
                self._db.register(name, pa.Table.from_pylist(list(rows.values()), schema))
        return self._db.sql(sql, params=params or None).to_arrow_table()


@pytest.fixture(scope="module")
def duck(tmp_path_factory) -> Duck:
    return Duck(DuckConfig(memory_limit="512MB", spill_dir=tmp_path_factory.mktemp("spill")))


@pytest.fixture(scope="module")
def world(duck) -> Iterator[World]:
    """One node owning every partition; tests that write use ``fresh`` instead."""
    w = World(duck)
    yield w
    w.cluster.close()


@pytest.fixture
def fresh(duck) -> Iterator[Any]:
    made: list[World] = []

    def build(node_ids: tuple[str, ...] = ("me",), unowned: frozenset[int] = frozenset()) -> World:
        made.append(World(duck, node_ids, unowned))
        return made[-1]

    yield build
    for w in made:
        w.cluster.close()


def run(engine: SqlEngine, sql: str, params: list | None = None, **options) -> tuple[pa.Table, SqlResult]:
    result = engine.execute(SqlRequest(sql, list(params or []), **options))
    return pa.Table.from_batches(list(result.batches), result.schema), result


def norm(v: Any) -> Any:
    if isinstance(v, decimal.Decimal):
        v = int(v) if v == v.to_integral_value() else float(v)
    if isinstance(v, float):
        return None if math.isnan(v) else round(v, 6)
    return v


def rows_of(table: pa.Table) -> list[tuple]:
    return [tuple(norm(v) for v in row.values()) for row in table.to_pylist()]


def bag(table: pa.Table) -> list[tuple]:
    """The rows as a multiset (an answer without ORDER BY has no order)."""
    return sorted(rows_of(table), key=lambda r: [(v is None, str(type(v)), v if v is not None else 0) for v in r])


def assert_answers_as_duckdb(world: World, engine: SqlEngine, sql: str, params: list | None = None,
                             ordered: bool = False) -> SqlResult:
    got, result = run(engine, sql, params)
    want = world.duckdb(sql, params)
    assert got.schema.names == want.schema.names and got.schema.types == want.schema.types, (got.schema, want.schema)
    assert (rows_of(got) == rows_of(want)) if ordered else (bag(got) == bag(want)), sql
    return result


def key_partition(key: str) -> int:
    return partition_for(key.encode(), P)


# ---- answers equal DuckDB's -------------------------------------------------------------------
QUERIES = [
    "SELECT * FROM players",
    "SELECT player, team, games FROM players WHERE player = 'p0007'",
    "SELECT player, total_score FROM players WHERE player IN ('p0001', 'p0100', 'nobody')",
    "SELECT player FROM players WHERE player >= 'p0010' AND player < 'p0020'",
    "SELECT key, score FROM scores WHERE key BETWEEN -20 AND 20",
    "SELECT key FROM scores WHERE key < -50 OR key > 50",
    "SELECT player, best FROM players WHERE best > 50 AND team = 'red'",
    "SELECT player FROM players WHERE team IS NULL OR NOT active",
    "SELECT player, last_seen FROM players WHERE last_seen > TIMESTAMP '2023-11-15 00:00:00+00'",
    "SELECT COUNT(*) AS n, COUNT(games) AS g, SUM(total_score) AS s, AVG(total_score) AS a, MIN(best) AS mn, "
    "MAX(best) AS mx FROM players",
    "SELECT team, COUNT(*) AS n, SUM(games) AS g, AVG(best) AS b, MIN(total_score) AS lo, MAX(total_score) AS hi "
    "FROM players GROUP BY team",
    "SELECT team, active, COUNT(*) AS n FROM players GROUP BY team, active HAVING COUNT(*) > 3",
    "SELECT COUNT(DISTINCT team) AS t FROM players WHERE games > 10",
    "SELECT COUNT(*) AS n FROM players WHERE player = 'nobody'",
    "SELECT SUM(score) AS s, COUNT(*) AS n FROM scores WHERE key >= -3",
    "SELECT p.player, s.score FROM players p JOIN scores s ON p.games = s.key WHERE p.team = 'red'",
    "WITH t AS (SELECT team, SUM(total_score) AS s FROM players GROUP BY team) SELECT team, s FROM t WHERE s > 0",
    "SELECT player FROM players WHERE games IN (SELECT key FROM scores WHERE key BETWEEN 0 AND 20)",
    # ordered: compared row by row (a top-k is cut on each owner, then again at the receiver)
    "SELECT player, total_score FROM players ORDER BY total_score DESC, player LIMIT 10",
    "SELECT player, best FROM players ORDER BY best NULLS FIRST, player LIMIT 7 OFFSET 3",
    "SELECT key, score FROM scores ORDER BY key LIMIT 5",
    "SELECT key FROM scores WHERE key > -30 ORDER BY 1 DESC LIMIT 4",
    "SELECT team, COUNT(*) AS n FROM players GROUP BY team ORDER BY n DESC, team NULLS FIRST",
    "SELECT * FROM players ORDER BY player DESC LIMIT 5",
    "SELECT MIN(player) AS a, MAX(team) AS b, COUNT(best) AS c, SUM(games) AS g FROM players WHERE games > 3",
]


@pytest.mark.parametrize("sql", QUERIES)
def test_answers_equal_duckdb(world, sql) -> None:
    assert_answers_as_duckdb(world, world.cluster.engine(), sql, ordered=" ORDER BY " in sql)


@pytest.mark.parametrize("sql", [
    "SELECT p.player, p.total_score, b.bonus FROM players p JOIN bonus b ON p.player = b.player WHERE b.bonus > 5",
    "SELECT p.player, b.bonus FROM players p LEFT JOIN bonus b ON p.player = b.player WHERE p.team = 'red'",
    "SELECT p.team, SUM(b.bonus) AS s, COUNT(*) AS n FROM players p JOIN bonus b ON p.player = b.player GROUP BY p.team",
    "SELECT COUNT(*) AS n FROM players p JOIN bonus b ON b.player = p.player AND b.bonus < p.games",
])
def test_a_join_of_co_partitioned_stores_runs_on_the_owners_and_equals_duckdb(fresh, sql) -> None:
    world = fresh(("me", "n2"))
    result = assert_answers_as_duckdb(world, world.cluster.engine(), sql)
    assert result.stats.get("joined_on_owners") is True
    asked = world.cluster.requests()
    assert asked and all(r.store == "players" and r.work.join == "bonus" for r in asked)  # bonus is never shipped
    assert {r.partitions for r in world.cluster.nodes["me"].requests} == {(0, 2)}
    assert {r.partitions for r in world.cluster.nodes["n2"].requests} == {(1, 3)}


def test_a_join_whose_shards_a_rebalance_parted_is_joined_at_the_receiver(fresh) -> None:
    """The planner sends the join to the owners; one owner no longer holds bonus beside
    players (NOT_COLOCATED): the statement is run again with both stores read separately."""
    world = fresh(("me", "n2"))
    world.cluster.move("bonus", 1, "me")
    sql = "SELECT p.player, b.bonus FROM players p JOIN bonus b ON p.player = b.player WHERE b.bonus > 2"
    result = assert_answers_as_duckdb(world, world.cluster.engine(), sql)
    assert not result.stats.get("joined_on_owners")
    assert any(r.store == "bonus" and r.work.join is None for r in world.cluster.requests())


def test_parameters_are_bound_per_request_and_plans_kept_per_parameters(world) -> None:
    engine = world.cluster.engine()
    sql = "SELECT COUNT(*) AS n, SUM(total_score) AS s FROM players WHERE total_score > ? AND player < ?"
    for params in ([0, "p0100"], [500, "p0100"], [500, "p0050"], [0, "p0100"], [1, "p0100"], [1.5, "p0100"]):
        for _ in range(2):
            assert_answers_as_duckdb(world, engine, sql, params)
    flag = "SELECT COUNT(*) AS n FROM players WHERE (total_score > 0) = ?"
    assert_answers_as_duckdb(world, engine, flag, [True])
    assert_answers_as_duckdb(world, engine, flag, [False])
    # the user's text runs at the receiver: $1 twice takes one value, a ? in a string is no placeholder
    numbered = "SELECT player, '?' AS q, + games FROM players WHERE games > $1 AND total_score > $1 * 100 AND team = $2"
    assert_answers_as_duckdb(world, engine, numbered, [5, "red"])
    assert_answers_as_duckdb(world, engine, numbered.replace("$1", "?", 1).replace("$1", "?").replace("$2", "?"),
                             [5, 5, "red"])


# ---- names and types are DuckDB's, whoever computes them ---------------------------------------------
@pytest.fixture(scope="module")
def worlds(duck) -> Iterator[dict[int, World]]:
    """The same rows on one node and on three."""
    made = {1: World(duck), 3: World(duck, ("me", "n2", "n3"))}
    yield made
    for w in made.values():
        w.cluster.close()


def assert_duckdb_types(world: World, engine: SqlEngine, sql: str) -> None:
    """Each column's DuckDB type (which Arrow's cannot tell: HUGEINT and DECIMAL(38,0) are both
    decimal128(38, 0)) is DuckDB's: the statement with every output in typeof(), the same plan
    shape, answers as DuckDB does."""
    tree = sqlglot.parse_one(sql, read="duckdb")
    tree.set("expressions", [exp.alias_(exp.func("typeof", e.unalias()), name, quoted=True)
                             for e, name in zip(tree.expressions, world.duckdb(sql).column_names)])
    assert_answers_as_duckdb(world, engine, tree.sql(dialect="duckdb"))


TYPED = [  # (statement, what the owners do)
    ("SELECT SUM(total_score) // COUNT(*) FROM players", "partial aggregate"),
    ("SELECT hex(SUM(total_score)), SUM(games) << 1, gcd(SUM(total_score), 6), SUM(active::INT) FROM players",
     "partial aggregate"),
    ("SELECT team, SUM(games) // COUNT(games), SUM(total_score), MAX(games) - MIN(games) FROM players GROUP BY team",
     "partial aggregate"),
    ("SELECT SUM(total_score) FROM players WHERE games > 3", "partial aggregate"),
    ("SELECT COUNT(*), SUM(score), AVG(key) FROM scores", "partial aggregate"),
    ("SELECT AVG(last_seen), AVG(total_score) FROM players", "columns"),  # DuckDB's AVG of timestamps has no SUM
    ("SELECT ALL + games, CAST(games AS VARCHAR), games != 3, - - total_score FROM players", "columns"),
    ("SELECT player, + total_score FROM players ORDER BY total_score DESC, player LIMIT 4", "top-k"),
    ("SELECT p.team, SUM(b.bonus) // 2 FROM players p JOIN bonus b ON p.player = b.player GROUP BY ALL",
     "join, columns"),
    ("SELECT SUM(b.bonus) // 2, COUNT(*) FROM players p JOIN bonus b ON p.player = b.player",
     "join, partial aggregate"),
]


@pytest.mark.parametrize("nodes", [1, 3])
@pytest.mark.parametrize(("sql", "pushed"), TYPED)
def test_names_and_types_are_duckdbs_wherever_the_work_runs(worlds, nodes, sql, pushed) -> None:
    world = worlds[nodes]
    engine = world.cluster.engine()
    world.cluster.forget()
    assert_answers_as_duckdb(world, engine, sql, ordered=" ORDER BY " in sql)
    assert {r.work.kind for r in world.cluster.requests() if r.store == "players" or "scores" in sql} == {pushed}
    assert_duckdb_types(world, engine, sql)


_OPERANDS = {"int": ["games", "total_score", "active::INT"], "float": ["best"], "any": ["team", "last_seen", "player"]}


@st.composite
def aggregate_statements(draw) -> str:
    """A single-store aggregate whose outputs are unaliased expressions over COUNT, SUM, MIN,
    MAX and AVG, grouped or not: what the owners compute as partial states."""
    def aggregate(exact: bool) -> str:  # a float's sum differs in its last digits with the order it is added in
        kind = draw(st.sampled_from(["int", "int", "any"] + ([] if exact else ["float"])))
        column = draw(st.sampled_from(_OPERANDS[kind]))
        funcs = ["COUNT", "MIN", "MAX"] + (["SUM", "SUM", "AVG"] if kind != "any" else [])
        return "COUNT(*)" if draw(st.booleans()) and kind == "any" else f"{draw(st.sampled_from(funcs))}({column})"

    def output() -> str:
        form = draw(st.sampled_from(["{}", "{} // 3", "{} + 1", "- {}", "+ {}", "typeof({})", "CAST({} AS VARCHAR)",
                                     "{} * {}", "hex({})", "{} % 7"]))
        exact = form.startswith(("CAST", "hex"))  # as text every digit counts
        return form.format(*[aggregate(exact) for _ in range(form.count("{}"))])

    group = draw(st.sampled_from([None, "team", "active"]))
    items = ([group] if group and draw(st.booleans()) else []) + [output() for _ in range(draw(st.integers(1, 3)))]
    sql = f"SELECT {', '.join(items)} FROM players"
    sql += draw(st.sampled_from(["", " WHERE games > 5", " WHERE team <> 'red'"]))
    return sql + (f" GROUP BY {group}" if group else "")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sql=aggregate_statements(), nodes=st.sampled_from([1, 3]))
def test_random_aggregates_answer_with_duckdbs_names_types_and_values(worlds, sql, nodes) -> None:
    world = worlds[nodes]
    engine = world.cluster.engine()
    try:
        world.duckdb(sql)
    except duckdb.Error:
        with pytest.raises(SqlError):
            run(engine, sql)
        return
    assert_answers_as_duckdb(world, engine, sql)
    assert_duckdb_types(world, engine, sql)


# ---- the point lookup ---------------------------------------------------------------------------
def test_a_point_lookup_is_read_in_process_and_dispatches_nothing(world) -> None:
    engine = world.cluster.engine()
    world.cluster.forget()
    got, result = run(engine, "SELECT player, team, total_score AS t FROM players WHERE player = ?", ["p0042"])
    assert rows_of(got) == rows_of(world.duckdb("SELECT player, team, total_score AS t FROM players "
                                                "WHERE player = 'p0042'"))
    assert got.schema.names == ["player", "team", "t"]
    node = world.cluster.nodes["me"]
    assert node.point_reads == [("players", key_partition("p0042"))] and node.requests == []
    assert result.rows is not None  # Python rows, no Arrow built unless asked
    assert (result.stats["partitions_queried"], result.stats["nodes"]) == (1, 1)
    # a key that is not there: no rows, still no dispatch
    got, _ = run(engine, "SELECT player FROM players WHERE player = 'nobody'")
    assert got.num_rows == 0 and node.requests == []


@pytest.mark.parametrize("sql", ["SELECT * FROM players WHERE player = 'p0007'",
                                 "SELECT ALL + games, last_seen AS seen FROM players WHERE player = 'p0007'"])
def test_a_point_lookup_answers_with_duckdbs_names_and_types(world, sql) -> None:
    assert_answers_as_duckdb(world, world.cluster.engine(), sql)


def key_in(partition: int, prefix: str = "p") -> str:
    """A player key of ``partition``: one of the rows, or with another ``prefix`` none."""
    return next(k for k in (f"{prefix}{i:04d}" for i in range(120)) if key_partition(k) == partition)


def assert_as_executed(now: SqlResult | None, full: SqlResult) -> None:
    """``now`` is execute's answer ``full``: rows, schema, token, stats (but the time)."""
    assert now is not None and now.schema == full.schema and now.rows == full.rows
    assert now.consistency_token == full.consistency_token
    assert {**now.stats, "elapsed_ms": 0} == {**full.stats, "elapsed_ms": 0}


def test_a_point_answer_given_at_once_is_the_one_execute_gives(fresh) -> None:
    """point_now (the loop server's) answers only what execute has planned and asks for no
    token, and then as execute does: rows, schema, token, stats (but the time), metrics."""
    world = fresh(("me", "n2"))
    engine = world.cluster.engine("me")
    sql = "SELECT player, best AS b FROM players WHERE player = ?"
    local, far = key_in(0), key_in(1)
    assert engine.point_now(SqlRequest(sql, [local])) is None  # not planned yet: execute plans it
    for key in (local, key_in(0, "none")):
        _, full = run(engine, sql, [key])
        now = engine.point_now(SqlRequest(sql, [key]))
        assert isinstance(now, SqlResult)
        assert_as_executed(now, full)
        assert_as_executed(engine.answer_now(SqlRequest(sql, [key])), full)  # type: ignore[arg-type]
    assert isinstance(engine.point_now(SqlRequest(sql, [far])), RoutedPoint)  # n2's partition: read from n2
    assert engine.point_now(SqlRequest(sql, [local], consistency_token=full.consistency_token)) is None
    assert engine.point_now(SqlRequest(sql, [local, 1])) is None  # not its parameters
    assert engine.point_now(SqlRequest("SELECT COUNT(*) FROM players", [])) is None


def test_a_routed_point_read_on_an_event_loop_answers_as_execute(fresh) -> None:
    """point_now (the loop server's), for a key another node owns, gives what reads the owner's
    entry on an event loop and answers as execute does: rows, schema, token, stats (but the
    time); only for what execute has planned and asks for no token; None when the owner cannot
    answer so (then execute takes its general path)."""
    world = fresh(("me", "n2"))
    engine = world.cluster.engine("me")
    n2 = world.cluster.nodes["n2"]
    sql = "SELECT player, best AS b FROM players WHERE player = ?"
    far = key_in(1)
    assert engine.point_now(SqlRequest(sql, [far])) is None  # not planned yet: execute plans it
    for key in (far, key_in(1, "none")):
        _, full = run(engine, sql, [key])
        world.cluster.forget()
        routed = engine.answer_now(SqlRequest(sql, [key]))
        assert isinstance(routed, RoutedPoint) and n2.point_reads == []  # read when awaited, not before
        assert_as_executed(asyncio.run(routed.answer()), full)
        assert n2.point_reads == [("players", 1)] and world.cluster.requests() == []
    assert engine.point_now(SqlRequest(sql, [far], consistency_token=full.consistency_token)) is None
    n2.materializer.shards.pop(("players", 1))  # n2 no longer holds it, though the view says so
    routed = engine.point_now(SqlRequest(sql, [far]))
    assert isinstance(routed, RoutedPoint) and asyncio.run(routed.answer()) is None


def test_a_point_lookup_this_node_cannot_read_in_process_goes_to_the_owner(fresh) -> None:
    """Partition 1 is on n2: the engine on me finds no local copy and asks n2 for the key's
    stored entry in the lean call (n2 reads it in process), not for a KeyQuery's rows."""
    world = fresh(("me", "n2"))
    engine = world.cluster.engine("me")
    key = next(f"p{i:04d}" for i in range(120) if key_partition(f"p{i:04d}") == 1)
    sql = f"SELECT player, best, active FROM players WHERE player = '{key}'"
    got, result = run(engine, sql)
    assert rows_of(got) == rows_of(world.duckdb(sql)) and got.num_rows == 1
    assert got.schema == world.duckdb(sql).schema
    n2 = world.cluster.nodes["n2"]
    assert n2.requests == [] and n2.point_reads == [("players", 1)]
    assert world.cluster.nodes["me"].requests == []
    assert (result.stats["partitions_queried"], result.stats["nodes"]) == (1, 1)


# ---- work pushed to the owners -------------------------------------------------------------------
def test_a_where_on_the_key_asks_only_the_partitions_that_hold_it(world) -> None:
    engine = world.cluster.engine()
    world.cluster.forget()
    _, result = run(engine, "SELECT player, team FROM players WHERE player IN ('p0001', 'p0002') AND best > 0")
    asked = world.cluster.requests()
    assert {p for r in asked for p in r.partitions} == {key_partition("p0001"), key_partition("p0002")}
    assert all(r.query == KeysQuery(("p0001", "p0002")) for r in asked)  # one multi-get per owner
    assert result.stats["partitions_queried"] == len({key_partition("p0001"), key_partition("p0002")})
    world.cluster.forget()
    run(engine, "SELECT key FROM scores WHERE key BETWEEN -20 AND 20")
    (asked,) = world.cluster.requests()
    assert asked.query == RangeQuery(-20, 20)


def test_a_top_k_is_cut_on_the_owners(fresh) -> None:
    world = fresh(("me", "n2"))
    sql = "SELECT player, total_score FROM players ORDER BY total_score DESC, player LIMIT 3"
    assert_answers_as_duckdb(world, world.cluster.engine(), sql, ordered=True)
    assert all(r.work.kind == "top-k" for r in world.cluster.requests())
    sent = [n for node in world.cluster.nodes.values() for n in node.rows_sent]
    assert len(sent) == 2 and all(n <= 3 for n in sent)  # each owner sent at most k rows of its 60


def test_aggregates_are_partial_on_the_owners_and_merged_at_the_receiver(fresh) -> None:
    world = fresh(("me", "n2"))
    sql = "SELECT team, COUNT(*) AS n, SUM(total_score) AS s, AVG(best) AS a FROM players GROUP BY team"
    assert_answers_as_duckdb(world, world.cluster.engine(), sql)
    assert all(r.work.kind == "partial aggregate" for r in world.cluster.requests())
    sent = [n for node in world.cluster.nodes.values() for n in node.rows_sent]
    assert len(sent) == 2 and all(n <= 4 for n in sent)  # a row per team (and NULL) from each owner, not its players


@pytest.mark.parametrize("sql, in_arrow", [
    ("SELECT COUNT(*) AS n, SUM(total_score) AS s, MIN(player) AS lo, MAX(last_seen) AS t FROM players", True),
    ("SELECT COUNT(*) FROM players WHERE team = 'red'", True),
    ("SELECT player, total_score FROM players ORDER BY total_score DESC, player LIMIT 3", True),
    ("SELECT * FROM players ORDER BY last_seen, player LIMIT 4 OFFSET 2", True),
    ("SELECT team, COUNT(*) AS n, SUM(total_score) AS s, MIN(player) AS lo FROM players GROUP BY team ORDER BY team",
     True),
    ("SELECT games, COUNT(*) AS n, MAX(last_seen) AS t FROM players GROUP BY games "
     "ORDER BY n DESC, games NULLS FIRST LIMIT 5 OFFSET 1", True),
    ("SELECT active, team, COUNT(games) AS g FROM players GROUP BY team, active", True),
    # HAVING, AVG and expressions over the merges stay with DuckDB
    ("SELECT team, COUNT(*) AS n FROM players GROUP BY team HAVING COUNT(*) > 3", False),
    ("SELECT team, AVG(total_score) AS a FROM players GROUP BY team", False),
    ("SELECT team, COUNT(*) + 1 AS n FROM players GROUP BY team", False),
    # a double's sum depends on the order it is added in, and NaN sorts otherwise: DuckDB does these
    ("SELECT COUNT(*) AS n, SUM(best) AS b FROM players", False),
    ("SELECT best, COUNT(*) AS n FROM players GROUP BY best", False),
    ("SELECT player, best FROM players ORDER BY best DESC, player LIMIT 3", False),
])
def test_a_merge_of_states_or_a_top_k_cut_is_finished_in_arrow_where_the_types_allow(fresh, sql, in_arrow) -> None:
    world = fresh(("me", "n2"))
    result = assert_answers_as_duckdb(world, world.cluster.engine(), sql, ordered=" ORDER BY " in sql)
    assert result.stats.get("finished_in_arrow", False) is in_arrow


# ---- EXPLAIN, SHOW, DESCRIBE -------------------------------------------------------------------
def test_explain_names_the_store_query_partitions_node_and_work(fresh) -> None:
    world = fresh(("me", "n2"))
    engine = world.cluster.engine()
    world.cluster.forget()
    plan, _ = run(engine, "EXPLAIN SELECT team, COUNT(*) FROM players WHERE player = 'p0009' GROUP BY team")
    assert plan.column_names == ["store", "query", "partitions", "node", "pushed_down", "at_receiver"]
    (row,) = plan.to_pylist()
    p = key_partition("p0009")
    assert row["store"] == "players" and "KeyQuery" in row["query"] and row["partitions"] == str(p)
    assert row["node"] == ("me (local)" if p % 2 == 0 else "n2")
    assert "partial aggregate" in row["pushed_down"] and "final aggregate" in row["at_receiver"]
    plan, _ = run(engine, "EXPLAIN SELECT player FROM players WHERE best > 1")
    assert {(r["partitions"], r["node"]) for r in plan.to_pylist()} == {("0,2", "me (local)"), ("1,3", "n2")}
    assert all("filter" in r["pushed_down"] for r in plan.to_pylist())
    assert world.cluster.requests() == []  # explaining reads nothing


def test_show_tables_and_describe_read_the_catalog(world) -> None:
    engine = world.cluster.engine()
    tables, _ = run(engine, "SHOW TABLES")
    assert tables.column(0).to_pylist() == ["bonus", "players", "scores"]
    cols, _ = run(engine, "DESCRIBE scores")
    assert cols.column(0).to_pylist() == ["key", "score", "rowtime"]


@pytest.mark.parametrize("form", ["main.{}", "public.{}", '"public"."{}"', "federator.main.{}", "FEDERATOR.PUBLIC.{}"])
def test_a_store_qualified_with_its_schema_or_database_is_the_store(world, form) -> None:
    """Postgres tools write public.store, DuckDB's main.store; columns may carry the same qualifier."""
    engine = world.cluster.engine()
    for sql in ("SELECT {p}.team, count(*) AS n FROM {p} JOIN {b} b ON b.player = {p}.player GROUP BY 1",
                "SELECT total_score FROM {p} WHERE player = 'p0007'"):
        got, _ = run(engine, sql.format(p=form.format("players"), b=form.format("bonus")))
        assert bag(got) == bag(world.duckdb(sql.format(p="players", b="bonus")))


# ---- errors ------------------------------------------------------------------------------------
def test_an_unknown_schema_says_where_stores_live(world) -> None:
    with pytest.raises(SqlError) as e:
        run(world.cluster.engine(), "SELECT * FROM other.players")
    assert e.value.code == "UNKNOWN_STORE" and "'main' or 'public'" in e.value.message


def test_an_unknown_store_names_the_stores_there_are(world) -> None:
    with pytest.raises(SqlError) as e:
        run(world.cluster.engine(), "SELECT * FROM nowhere")
    assert e.value.code == "UNKNOWN_STORE"
    assert "nowhere" in e.value.message and "bonus, players, scores" in e.value.message


def test_a_store_this_node_cannot_read_says_why(world) -> None:
    engine = world.cluster.engine()
    world.cluster.nodes["me"].unusable_stores["ranks"] = "its store type 'leaderboard' is not installed"
    try:
        with pytest.raises(SqlError) as e:
            run(engine, "SELECT * FROM ranks")
    finally:
        world.cluster.nodes["me"].unusable_stores.clear()
    assert e.value.code == "UNKNOWN_STORE" and "leaderboard" in e.value.message


@pytest.mark.parametrize("sql", ["SELECT COUNT(*) FROM players", "SELECT player FROM players WHERE player = ?"])
def test_a_partition_no_node_serves_fails_the_statement_naming_it(fresh, sql) -> None:
    """Partition 2 has no owner: after retrying until the deadline, UNAVAILABLE naming it,
    never an answer without its rows."""
    world = fresh(unowned=frozenset({2}))
    key = next(f"p{i:04d}" for i in range(120) if key_partition(f"p{i:04d}") == 2)
    with pytest.raises(SqlError) as e:
        run(world.cluster.engine(), sql, [key] if "?" in sql else [], timeout_ms=150)
    assert (e.value.code, e.value.partitions) == ("UNAVAILABLE", [2]), e.value.message
    assert "no node serves it" in e.value.message and e.value.retry_after


def test_a_deadline_already_past_is_a_timeout(world) -> None:
    with pytest.raises(SqlError) as e:
        run(world.cluster.engine(), "SELECT team, COUNT(*) FROM players GROUP BY team", timeout_ms=0)
    assert e.value.code == "TIMEOUT" and "timeout_ms" in e.value.message


@pytest.mark.parametrize(("sql", "code"), [
    ("SELECT CAST(team AS INTEGER) AS t FROM players", "INVALID_DATA"),  # fails in the owners' SQL
    ("SELECT nothing FROM players", "UNKNOWN_COLUMN"),
    ("SELEC player FROM players", "SQL_PARSE_ERROR"),
    ("DELETE FROM players", "UNSUPPORTED"),
    ("SELECT + team FROM players", "SQL_PARSE_ERROR"),  # DuckDB has no unary + of a VARCHAR
    ("SELECT + team FROM players WHERE player = 'p0001'", "SQL_PARSE_ERROR"),
])
def test_the_statement_s_own_errors_have_their_codes(world, sql, code) -> None:
    with pytest.raises(SqlError) as e:
        run(world.cluster.engine(), sql)
    assert e.value.code == code, e.value.message


def test_a_garbled_consistency_token_is_an_invalid_parameter(world) -> None:
    with pytest.raises(SqlError) as e:
        run(world.cluster.engine(), "SELECT COUNT(*) FROM players", consistency_token="garbage!")
    assert e.value.code == "INVALID_PARAMETER"


# ---- consistency tokens ---------------------------------------------------------------------------
def test_the_token_is_the_positions_the_owners_answered_at(fresh) -> None:
    world = fresh(("me", "n2"))
    engine = world.cluster.engine()
    players, scores = (world.cluster.stores[s].topic for s in ("players", "scores"))
    _, result = run(engine, "SELECT COUNT(*) FROM players")
    assert Position.from_token(result.consistency_token) == Position(
        {players: world.cluster.position().partitions(players)})
    # a point lookup: its key's partition only, read in-process (partition 0, on me) or by its owner (1, on n2)
    for p in (0, 1):
        key = next(f"p{i:04d}" for i in range(120) if key_partition(f"p{i:04d}") == p)
        assert world.put("players", key, {"team": "red", "total_score": 1}) == p
        world.cluster.forget()
        got, point = run(engine, f"SELECT team FROM players WHERE player = '{key}'")
        assert got.to_pylist() == [{"team": "red"}]
        # tried in process on me; partition 1 then read on n2 in the lean call; no KeyQuery either way
        assert world.cluster.nodes["me"].point_reads and not world.cluster.requests()
        assert bool(world.cluster.nodes["n2"].point_reads) == (p == 1)
        assert Position.from_token(point.consistency_token) == world.cluster.shards[("players", p)].position
    # a token passed in is carried on: the answer reflects at least what the client had seen
    _, both = run(engine, "SELECT COUNT(*) FROM scores", consistency_token=point.consistency_token)
    assert Position.from_token(both.consistency_token) == Position(
        {players: {1: world.cluster.shards[("players", 1)].offset}, scores: world.cluster.position().partitions(scores)})


@pytest.mark.parametrize("sql", ["SELECT team FROM players WHERE player = 'p0005'", "SELECT COUNT(*) FROM players"])
def test_a_token_the_owners_have_reached_is_answered_and_one_from_the_future_is_not_up_to_bound(world, sql) -> None:
    engine = world.cluster.engine()
    _, first = run(engine, sql)
    got, _ = run(engine, sql, consistency_token=first.consistency_token)  # read your own reads
    assert bag(got) == bag(world.duckdb(sql))
    seen = Position.from_token(first.consistency_token)
    ahead = Position({t: {p: o + 1000 for p, o in seen.partitions(t).items()} for t in seen.topics()})
    with pytest.raises(SqlError) as e:
        run(engine, sql, consistency_token=ahead.to_token(), timeout_ms=150)
    assert e.value.code == "NOT_UP_TO_BOUND", e.value.message
    assert e.value.partitions == sorted(seen.partitions(world.cluster.stores["players"].topic))


# ---- answers reused over unchanged positions ---------------------------------------------------
def test_a_repeated_statement_reuses_its_answer_until_a_position_moves(fresh) -> None:
    world = fresh(("me", "n2"))
    engine = world.cluster.engine()
    # HAVING keeps the statement in DuckDB (a plain merge of states is finished in Arrow, never kept)
    sql = ("SELECT key % 5 AS g, COUNT(*) AS n, SUM(key) AS s FROM scores WHERE key > -50 GROUP BY g "
           "HAVING COUNT(*) > 0 ORDER BY g")
    first = assert_answers_as_duckdb(world, engine, sql, ordered=True)
    second = assert_answers_as_duckdb(world, engine, sql, ordered=True)
    assert not first.stats.get("answer_reused") and second.stats.get("answer_reused") is True
    assert second.consistency_token == first.consistency_token
    world.put("scores", 1_000_003, 2.5)  # one partition moves on
    third = assert_answers_as_duckdb(world, engine, sql, ordered=True)
    assert not third.stats.get("answer_reused") and third.consistency_token != first.consistency_token
    assert assert_answers_as_duckdb(world, engine, sql, ordered=True).stats.get("answer_reused") is True


def test_a_kept_answer_given_at_once_is_the_one_execute_gives(fresh) -> None:
    """local_kept (the loop server's) gives a statement's kept answer while its partitions
    are where they were, as execute would (rows, token, stats but the time); None before it is
    kept, once a partition moves, and for a point query's text."""
    world = fresh()
    engine = world.cluster.engine()
    sql = "SELECT key % 5 AS g, COUNT(*) AS n FROM scores WHERE key > -50 GROUP BY g HAVING COUNT(*) > 0 ORDER BY g"
    assert engine.local_kept(SqlRequest(sql)) is None  # never run
    run(engine, sql)
    got, full = run(engine, sql)
    assert full.stats.get("answer_reused") is True
    now = engine.local_kept(SqlRequest(sql))
    assert now is not None and pa.Table.from_batches(list(now.batches), now.schema) == got
    assert now.consistency_token == full.consistency_token
    assert {**now.stats, "elapsed_ms": 0} == {**full.stats, "elapsed_ms": 0}
    assert engine.local_kept(SqlRequest(sql, allow_stale=True)) is None
    world.put("scores", 1_000_003, 2.5)  # a partition moves on: execute reads again
    assert engine.local_kept(SqlRequest(sql)) is None
    point = "SELECT * FROM scores WHERE key = 7"
    run(engine, point)
    run(engine, point)
    assert engine.local_kept(SqlRequest(point)) is None


@pytest.mark.parametrize("sql", [
    "SELECT key, score FROM scores ORDER BY score DESC LIMIT 3",  # a top-k cut, finished in Arrow
    "SELECT COUNT(*) AS n, SUM(score) AS s FROM scores",  # a merge of states, finished in Arrow
    "SELECT key, score FROM scores WHERE key BETWEEN -9 AND 9",  # the owners' rows as they sent them
])
def test_a_statement_over_partitions_still_where_it_read_them_asks_no_owner(fresh, sql) -> None:
    """The node knows its own partitions' offsets without asking (another node's, from its
    positions watch): while none of the statement's stores moved, its answer is given again
    without a call; a write, or a copy reset or handed over (the epoch), makes it ask."""
    world = fresh()
    engine = world.cluster.engine()
    ordered = "ORDER BY" in sql
    first = assert_answers_as_duckdb(world, engine, sql, ordered=ordered)
    world.cluster.forget()
    second = assert_answers_as_duckdb(world, engine, sql, ordered=ordered)
    assert not first.stats.get("answer_reused") and second.stats.get("answer_reused") is True
    assert second.stats["partitions_queried"] == 0 and not world.cluster.requests()
    assert second.consistency_token == first.consistency_token
    world.put("scores", 3, 1e6)  # one partition moves on
    third = assert_answers_as_duckdb(world, engine, sql, ordered=ordered)
    assert not third.stats.get("answer_reused") and world.cluster.requests()
    assert third.consistency_token != first.consistency_token
    world.cluster.nodes["me"].materializer.epoch = 1  # a copy was reset: its offsets may name other rows
    world.cluster.forget()
    assert assert_answers_as_duckdb(world, engine, sql, ordered=ordered).stats["partitions_queried"] > 0
    assert world.cluster.requests()
    world.cluster.forget()
    assert assert_answers_as_duckdb(world, engine, sql, ordered=ordered).stats["partitions_queried"] == 0
    assert not world.cluster.requests()


@pytest.mark.parametrize("sql", [
    "SELECT p.team, SUM(b.bonus) AS s, COUNT(*) AS n FROM players p JOIN bonus b ON p.player = b.player GROUP BY p.team",
    "SELECT p.player, b.bonus FROM players p JOIN bonus b ON p.player = b.player WHERE b.bonus > 2",
])
def test_a_join_on_the_owners_is_run_again_after_a_write_to_either_store(fresh, sql) -> None:
    """The joined store is read by the owners beside the other: a write to it moves the answer."""
    world = fresh()
    engine = world.cluster.engine()
    assert_answers_as_duckdb(world, engine, sql)
    assert assert_answers_as_duckdb(world, engine, sql).stats.get("answer_reused") is True
    world.put("bonus", "p0004", 12)  # the joined store only
    world.cluster.forget()
    assert assert_answers_as_duckdb(world, engine, sql).stats["partitions_queried"] > 0
    world.put("players", "p0004", {"team": "red", "games": 3, "total_score": 7, "best": None, "active": True,
                                   "last_seen": BASE})
    world.cluster.forget()
    assert assert_answers_as_duckdb(world, engine, sql).stats["partitions_queried"] > 0


def test_a_partition_another_node_owns_is_asked_while_its_position_is_not_known(fresh) -> None:
    """n2 has no positions watch here (no key port): its partitions are asked every time."""
    world = fresh(("me", "n2"))
    engine = world.cluster.engine()
    sql = "SELECT key, score FROM scores ORDER BY score DESC LIMIT 3"
    for _ in range(2):
        world.cluster.forget()
        assert assert_answers_as_duckdb(world, engine, sql, ordered=True).stats["partitions_queried"] > 0
        assert world.cluster.nodes["n2"].requests


def test_a_statement_with_a_volatile_function_is_never_reused(world) -> None:
    engine = world.cluster.engine()
    sql = "SELECT COUNT(*) + CAST(random() * 0 AS BIGINT) AS n FROM scores"
    assert not any(run(engine, sql)[1].stats.get("answer_reused") for _ in range(3))


def test_other_parameters_are_not_answered_from_a_kept_answer(world) -> None:
    engine = world.cluster.engine()
    sql = "SELECT COUNT(*) AS n FROM players WHERE total_score > ?"
    for params in ([100], [100], [2000], [2000.0], [100]):
        assert_answers_as_duckdb(world, engine, sql, params)


def test_a_kept_answer_is_reused_for_reuse_answers_seconds_only_and_never_with_zero(fresh) -> None:
    world = fresh()
    sql = "SELECT team, COUNT(*) AS n FROM players GROUP BY team HAVING COUNT(*) > 0"  # in DuckDB: kept
    world.cluster.nodes["me"].config.reuse_answers_seconds = 0.05
    engine = world.cluster.engine()
    assert [run(engine, sql)[1].stats.get("answer_reused") for _ in range(2)] == [None, True]
    time.sleep(0.1)
    assert not run(engine, sql)[1].stats.get("answer_reused")
    world.cluster.nodes["me"].config.reuse_answers_seconds = 0  # --reuse-answers-seconds 0: off
    engine = world.cluster.engine()
    assert not any(run(engine, sql)[1].stats.get("answer_reused") for _ in range(2))


def test_statement_answers_bounds_how_many_answers_are_kept_and_zero_keeps_none(fresh) -> None:
    world = fresh()
    first, second = (f"SELECT team, COUNT(*) AS n FROM players GROUP BY team HAVING COUNT(*) > {n}" for n in (0, 1))
    world.cluster.nodes["me"].config.statement_answers = 1
    engine = world.cluster.engine()
    run(engine, first), run(engine, second)  # the second pushes the first out
    assert not run(engine, first)[1].stats.get("answer_reused")
    assert run(engine, first)[1].stats.get("answer_reused") is True
    world.cluster.nodes["me"].config.statement_answers = 0  # --statement-answers 0: off
    engine = world.cluster.engine()
    assert not any(run(engine, first)[1].stats.get("answer_reused") for _ in range(2))


def test_a_store_defined_again_over_the_same_changelog_is_not_answered_from_a_kept_answer(fresh) -> None:
    """The catalog gives scores' value another name; no position moved. The statement is
    planned again for the new definition, and so must its answer be."""
    world = fresh()
    engine = world.cluster.engine()
    sql = "SELECT * FROM scores WHERE key > 40 ORDER BY key"
    assert run(engine, sql)[0].column_names == ["key", "score"]
    assert run(engine, sql)[1].stats.get("answer_reused") is True
    again = StoreDefinition.from_dict({**SCORES, "value": {"name": "points", "format": "double"}}, REGISTRY)
    node = world.cluster.nodes["me"]
    node.stores = {**node.stores, "scores": again}  # as the node takes a catalog change: a new dict
    for (store, _), shard in world.cluster.shards.items():
        if store == "scores":  # the shards read with the new definition, as they would be reopened
            shard.definition, shard.schema = again, again.arrow_schema()
    got, result = run(engine, sql)
    assert got.column_names == ["key", "points"] and not result.stats.get("answer_reused")
    assert got.num_rows == world.duckdb(sql).num_rows


def test_an_unknown_name_before_the_catalog_was_read_is_unavailable_not_unknown(world) -> None:
    node = world.cluster.nodes["me"]
    node.catalog_read = lambda: False
    try:
        with pytest.raises(SqlError) as e:
            run(world.cluster.engine(), "SELECT * FROM nowhere")
        assert e.value.code == "UNAVAILABLE" and "not read the catalog yet" in e.value.message
        assert run(world.cluster.engine(), "SELECT count(*) FROM players")[0].num_rows == 1  # known stores answer
    finally:
        node.catalog_read = lambda: True
