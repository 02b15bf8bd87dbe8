"""Global stores in the SQL engine, over a cluster in one process (tests/unit/memory_cluster.py):
a global store is answered by the node asked, from its own copies, and a join of a partitioned
store with a global one runs on the partitioned store's owners, whatever the ON condition;
every answer equals DuckDB's over the same rows."""

from __future__ import annotations

import random
from typing import Any, Iterator

import duckdb
import pyarrow as pa
import pytest

from federator.catalog.definition import DefinitionError, StoreDefinition
from federator.owner.duck import Duck, DuckConfig
from federator.query.position import Position
from federator.sql.copartition import join_mode
from federator.sql.result import SqlRequest
from tests.registry import REGISTRY
from tests.unit.memory_cluster import MemoryCluster

NODES = ("me", "n1", "n2")
ORDERS = {"name": "orders", "type": "kv", "topic": "app-orders-changelog", "partitions": 4,
          "key": {"name": "order_id", "format": "long"},
          "value": {"format": "json", "fields": [{"name": "region", "type": "string"},
                                                 {"name": "amount", "type": "long"}]}}
# global, with another partition count and key format than orders: co-partitioning could not join them
REGIONS = {"name": "regions", "type": "kv", "topic": "app-regions-changelog", "partitions": 3, "global": True,
           "key": {"name": "region", "format": "string"},
           "value": {"format": "json", "fields": [{"name": "label", "type": "string"},
                                                  {"name": "floor", "type": "long"}]}}
RATES = {"name": "rates", "type": "kv", "topic": "app-rates-changelog", "partitions": 2, "global": True,
         "key": {"name": "region", "format": "string"}, "value": {"name": "rate", "format": "double"}}


def definitions() -> list[StoreDefinition]:
    return [StoreDefinition.from_dict(d, REGISTRY) for d in (ORDERS, REGIONS, RATES)]


@pytest.fixture(scope="module")
def duck(tmp_path_factory) -> Duck:
    return Duck(DuckConfig(memory_limit="512MB", spill_dir=tmp_path_factory.mktemp("spill")))


class World:
    def __init__(self, duck: Duck) -> None:
        self.cluster = MemoryCluster(definitions(), duck, NODES)
        self.rows: dict[str, list[dict[str, Any]]] = {"orders": [], "regions": [], "rates": []}
        rnd = random.Random(43)
        for i in range(200):
            self.put("orders", i * 7 - 300, {"region": rnd.choice(["north", "south", "east", "west", "moon", None]),
                                             "amount": rnd.randrange(0, 500)})
        for name, floor in (("north", 100), ("south", 0), ("east", 250), ("west", None)):
            self.put("regions", name, {"label": name.upper(), "floor": floor})
        for name, rate in (("north", 0.5), ("east", 1.25), ("atlantis", 9.0)):
            self.put("rates", name, rate)

    def put(self, store: str, key: Any, value: Any) -> Position:
        defn = self.cluster.stores[store]
        row = dict(value) if isinstance(value, dict) else {defn.value_name: value}
        self.rows[store] = [r for r in self.rows[store] if r[defn.key_name] != key] + [{defn.key_name: key, **row}]
        p = self.cluster.write(store, key, value)
        return Position.of(defn.topic, p, self.cluster.shards[(store, p)].offset)

    def duckdb(self, sql: str) -> list[tuple]:
        db = duckdb.connect()
        for name, rows in self.rows.items():
            schema = pa.schema([f for f in self.cluster.stores[name].arrow_schema() if f.name != "rowtime"])
            db.register(name, pa.Table.from_pylist(rows, schema))
        return sorted_rows(db.sql(sql).to_arrow_table())

    def sql(self, sql: str, node: str = "me", **options: Any) -> tuple[list[tuple], Any]:
        result = self.cluster.engine(node).execute(SqlRequest(sql, **options))
        return sorted_rows(pa.Table.from_batches(list(result.batches), result.schema)), result


def sorted_rows(table: pa.Table) -> list[tuple]:
    return sorted((tuple(r.values()) for r in table.to_pylist()), key=lambda r: [(v is not None, str(v)) for v in r])


@pytest.fixture
def world(duck) -> Iterator[World]:
    w = World(duck)
    yield w
    w.cluster.close()


@pytest.mark.parametrize("node", NODES)
def test_a_global_store_is_answered_by_the_node_asked_alone(world, node) -> None:
    for sql in ("SELECT * FROM regions", "SELECT COUNT(*), SUM(floor) FROM regions WHERE floor IS NOT NULL",
                "SELECT label FROM regions WHERE region = 'east'"):
        world.cluster.forget()
        got, _ = world.sql(sql, node)
        assert got == world.duckdb(sql), sql
        asked = {n for n, nd in world.cluster.nodes.items() if nd.requests or nd.point_reads}
        assert asked == {node}, (sql, asked)


JOINS = [
    # on the global store's key
    "SELECT o.order_id, o.amount, r.label FROM orders o JOIN regions r ON o.region = r.region",
    "SELECT o.order_id, r.label FROM orders o LEFT JOIN regions r ON o.region = r.region",
    # on no key at all, and on a condition that is no equality
    "SELECT o.order_id, r.region FROM orders o JOIN regions r ON o.amount >= r.floor WHERE o.amount > 400",
    "SELECT r.label, COUNT(*) AS n, SUM(o.amount) AS total FROM orders o JOIN regions r "
    "ON o.region = r.region AND o.amount > r.floor GROUP BY r.label",
    # the global store first: an inner join still runs on the orders' owners
    "SELECT r.label, o.order_id FROM regions r JOIN orders o ON r.region = o.region WHERE o.order_id < 0",
    "SELECT * FROM orders o JOIN rates x ON o.region = x.region ORDER BY o.amount DESC, o.order_id LIMIT 5",
    "SELECT o.order_id, o.amount * x.rate AS due FROM orders o JOIN rates x ON x.region = o.region "
    "WHERE o.order_id BETWEEN -100 AND 100",
]


@pytest.mark.parametrize("sql", JOINS)
def test_a_join_with_a_global_store_runs_on_the_owners_and_is_duckdbs_answer(world, sql) -> None:
    got, result = world.sql(sql)
    assert got == world.duckdb(sql)
    assert result.stats.get("joined_on_owners") is True
    requests = world.cluster.requests()
    assert requests and all(r.store == "orders" and r.work.join in ("regions", "rates") for r in requests)
    assert {n for n, nd in world.cluster.nodes.items() if nd.requests} == set(NODES)  # each owner joined its own


@pytest.mark.parametrize("sql", [
    # a LEFT JOIN keeping the global store's rows: each owner would keep them all
    "SELECT r.region, o.order_id FROM regions r LEFT JOIN orders o ON r.region = o.region",
    # two global stores: both read here, joined here
    "SELECT r.label, x.rate FROM regions r JOIN rates x ON r.region = x.region",
])
def test_joins_the_owners_cannot_run_are_joined_by_the_receiver(world, sql) -> None:
    world.cluster.forget()
    got, result = world.sql(sql)
    assert got == world.duckdb(sql)
    assert "joined_on_owners" not in result.stats
    assert all(r.work is None or r.work.join is None for r in world.cluster.requests())
    global_reads = [(n, r.store) for n, nd in world.cluster.nodes.items() for r in nd.requests
                    if r.store in ("regions", "rates")]
    assert global_reads and {n for n, _ in global_reads} == {"me"}


def test_the_join_mode_decision() -> None:
    orders, regions, rates = definitions()
    assert join_mode(orders, regions, left_join=False) == "broadcast"
    assert join_mode(orders, regions, left_join=True) == "broadcast"
    assert join_mode(regions, orders, left_join=False) == "broadcast, swapped"
    assert join_mode(regions, orders, left_join=True) is None
    assert join_mode(regions, rates, left_join=False) is None
    assert join_mode(orders, orders, left_join=False) == "co-partitioned"


def test_a_token_read_of_a_global_store_sees_the_write_on_every_node(world) -> None:
    written = world.put("regions", "polar", {"label": "POLAR", "floor": 7})
    ((topic, p, offset),) = list(written)
    for node in NODES:
        got, result = world.sql("SELECT label FROM regions WHERE floor = 7", node,
                                consistency_token=written.to_token())
        assert got == [("POLAR",)]
        assert Position.from_token(result.consistency_token).get(topic, p) >= offset  # the answer's token has it


def test_explain_names_the_node_asked_for_a_global_store_and_the_owners_for_the_join(world) -> None:
    got, _ = world.sql("EXPLAIN SELECT * FROM regions", "n1")
    assert got and {row[3] for row in got} == {"n1 (local)"}
    assert all("global store" in row[1] for row in got)
    got, _ = world.sql("EXPLAIN SELECT o.amount, r.label FROM orders o JOIN regions r ON o.amount > r.floor")
    assert {row[0] for row in got} == {"orders"}
    assert all("join with global store regions on the owners of orders" in row[1] for row in got)


def test_a_definition_says_global_as_a_boolean() -> None:
    defn = StoreDefinition.from_dict(REGIONS, REGISTRY)
    assert defn.is_global and defn.scope == "global" and defn.to_dict()["global"] is True
    assert StoreDefinition.from_json(defn.to_json(), REGISTRY) == defn
    plain = StoreDefinition.from_dict(ORDERS, REGISTRY)
    assert plain.scope == "partitioned" and "global" not in plain.to_dict()
    assert plain != StoreDefinition.from_dict({**ORDERS, "global": True}, REGISTRY)
    with pytest.raises(DefinitionError, match="field 'global' must be true or false, got 'yes'"):
        StoreDefinition.from_dict({**REGIONS, "global": "yes"}, REGISTRY)


@pytest.mark.parametrize("given, wanted", [(True, True), (False, False), ("yes", None)])
def test_the_spark_sink_defines_a_global_store_when_asked(given, wanted) -> None:
    """write_store(global_store=...) and the stream writer's option("global") both build the
    definition through the sink's shape check (no Spark session needed for it)."""
    from pyspark.sql.types import StringType, StructField, StructType

    from federator_spark.sink.errors import SinkError
    from federator_spark.sink.plan import Columns, shape

    columns = Columns(StructType([StructField("team", StringType()), StructField("city", StringType())]))
    kw = dict(key="team", value=None, type="kv", partitions=2, topic="app-teams-changelog", window_start=None,
              window_size_ms=None, session_start=None, session_end=None, registry=REGISTRY, global_store=given)
    if wanted is None:
        with pytest.raises(SinkError, match="global_store='yes': pass True"):
            shape(columns, "teams", **kw)
    else:
        assert shape(columns, "teams", **kw).defn.is_global is wanted
