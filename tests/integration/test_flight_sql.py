"""Arrow Flight SQL on a live three-node cluster, through the real ADBC Flight SQL driver (and
pyarrow.flight for the headers), answers compared with DuckDB over the same rows."""

from __future__ import annotations

import contextlib
import json
import random
import signal
import uuid

import adbc_driver_flightsql.dbapi as flightsql
import adbc_driver_manager
import duckdb
import pyarrow as pa
import pyarrow.flight as flight
import pytest

from federator.flight import protocol
from federator.partitioner import partition_for
from federator.query.position import Position
from tests.integration.changelog_util import produce, register
from tests.integration.cluster import Cluster
from tests.integration.test_sql import BASE, duck, post, rows_of, sort_key, ts

P = 6
FIELDS = {"team": "string", "games": "long", "total_score": "long", "best": "double", "active": "boolean",
          "last_seen": "timestamp"}


@pytest.fixture(scope="module")
def flight_cluster(broker, tmp_path_factory):
    app_id = f"fl{uuid.uuid4().hex[:8]}"
    rnd = random.Random(7)
    fields = [{"name": n, "type": t} for n, t in FIELDS.items()]
    players = register(broker, app_id, {"name": "players", "type": "kv", "partitions": P,
                                        "key": {"name": "player", "format": "string"},
                                        "value": {"format": "json", "fields": fields}})
    rows = [{
        "player": f"p{i:04d}", "team": rnd.choice(["red", "blue", "green", None]),
        "games": rnd.choice([None, rnd.randrange(0, 50)]), "total_score": rnd.randrange(-500, 5000),
        "best": rnd.choice([None, round(rnd.uniform(-10, 100), 3)]), "active": rnd.choice([True, False, None]),
        "last_seen": BASE + rnd.randrange(0, 86_400_000),
    } for i in range(300)]
    produce(broker, players.topic, P, [
        (r["player"].encode(), r["player"].encode(),
         players.value.serialize({k: v for k, v in r.items() if k != "player"}), r["last_seen"]) for r in rows])
    scores = register(broker, app_id, {"name": "scores", "type": "kv", "partitions": P, "key": {"format": "long"},
                                       "value": {"name": "score", "format": "double"}})
    score_rows = [{"key": k, "score": k * 1.5} for k in range(-90, 90, 3)]
    produce(broker, scores.topic, P, [(scores.key.serialize(r["key"]),) * 2 + (scores.value.serialize(r["score"]), 1)
                                      for r in score_rows])

    c = Cluster(broker.bootstrap_servers, app_id, tmp_path_factory.mktemp("flightnodes"), size=3,
                standby_replicas=1, flight_sql=True)
    c.start()
    try:
        for store in ("players", "scores"):
            c.wait_settled(store, P, timeout=60)
        db = duckdb.connect()
        # DuckDB gets the same rows typed as the stores' own Arrow schemas (less rowtime).
        db.register("players", pa.Table.from_pylist([{**r, "last_seen": ts(r["last_seen"])} for r in rows],
                                                    schema=_without_rowtime(players.arrow_schema())))
        db.register("scores", pa.Table.from_pylist(score_rows, schema=_without_rowtime(scores.arrow_schema())))
        db.execute("SET TimeZone = 'UTC'")
        yield c, db
    finally:
        c.stop()


def _without_rowtime(schema: pa.Schema) -> pa.Schema:
    return schema.remove(schema.get_field_index("rowtime"))


def uri(node) -> str:
    return f"grpc://127.0.0.1:{node.flight_port}"


def adbc_query(node, sql: str, params=None) -> pa.Table:
    with flightsql.connect(uri(node)) as conn, conn.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetch_arrow_table()


QUERIES = [
    "SELECT * FROM players",
    "SELECT player, team, games FROM players WHERE player = 'p0007'",
    "SELECT player, total_score FROM players WHERE player IN ('p0001', 'p0100', 'p0299', 'nobody')",
    "SELECT player, best FROM players WHERE player >= 'p01' AND player < 'p02' AND best > 50 AND team LIKE '%e%'",
    "SELECT team, COUNT(*) AS n, SUM(games) AS g, AVG(best) AS b, MIN(last_seen) AS first FROM players GROUP BY team",
    "SELECT COUNT(DISTINCT team) AS t, MAX(total_score) AS mx FROM players WHERE active",
    "SELECT key, score FROM scores WHERE key BETWEEN -20 AND 20",
]
ORDERED = [
    "SELECT player, total_score FROM players ORDER BY total_score DESC, player LIMIT 10",
    "SELECT key, score * 2 AS twice FROM scores ORDER BY key DESC LIMIT 7 OFFSET 2",
]


@pytest.mark.parametrize("sql", QUERIES)
def test_queries_equal_duckdb(flight_cluster, sql) -> None:
    cluster, db = flight_cluster
    got = adbc_query(random.choice(cluster.nodes), sql)
    want = duck(db, sql)
    assert got.column_names == want.column_names
    assert sorted(rows_of(got), key=sort_key) == sorted(rows_of(want), key=sort_key)


@pytest.mark.parametrize("sql", ORDERED)
def test_ordered_queries_equal_duckdb_in_order(flight_cluster, sql) -> None:
    cluster, db = flight_cluster
    got = adbc_query(cluster.nodes[1], sql)
    assert rows_of(got) == rows_of(duck(db, sql))


@pytest.mark.parametrize("where", ["player = 'p0003'", "games > 3"])  # a point lookup or not: DuckDB's types
def test_result_types_are_duckdbs(flight_cluster, where) -> None:
    cluster, db = flight_cluster
    sql = f"SELECT player, games, best, active, last_seen FROM players WHERE {where}"
    got = adbc_query(cluster.nodes[0], sql)
    assert got.schema.types == [pa.string(), pa.int64(), pa.float64(), pa.bool_(), pa.timestamp("us", tz="UTC")]
    assert got.schema == duck(db, sql).schema
    assert sorted(got.column("player").to_pylist()) == sorted(duck(db, sql).column("player").to_pylist())


def test_parameterized_queries_reuse_one_prepared_statement(flight_cluster) -> None:
    cluster, db = flight_cluster
    sql = "SELECT player, total_score FROM players WHERE total_score > ? AND team = ? ORDER BY player"
    with flightsql.connect(uri(cluster.nodes[2])) as conn, conn.cursor() as cur:
        for params in ([4000, "red"], [100, "blue"], [-1000, "nobody"]):
            cur.execute(sql, params)  # same SQL text: the driver prepares once and binds again
            assert rows_of(cur.fetch_arrow_table()) == rows_of(duck(db, sql.replace("?", "{}").format(
                params[0], f"'{params[1]}'")))
        cur.execute("SELECT key, score FROM scores WHERE key = ?", [-3])
        assert cur.fetchall() == [(-3, -4.5)]
        cur.execute("SELECT COUNT(*) AS n FROM scores WHERE score < ?", [0.5])
        assert cur.fetchall() == [(duck(db, "SELECT COUNT(*) FROM scores WHERE score < 0.5").column(0)[0].as_py(),)]


def test_a_batch_of_parameter_rows_runs_once_per_row(flight_cluster) -> None:
    cluster, _ = flight_cluster
    params = pa.record_batch({"p": pa.array(["p0010", "p0020", "nobody", "p0030"])})
    got = adbc_query(cluster.nodes[0], "SELECT player FROM players WHERE player = ?", params)
    assert got.column("player").to_pylist() == ["p0010", "p0020", "p0030"]


def test_data_owned_by_other_nodes_is_routed(flight_cluster) -> None:
    cluster, db = flight_cluster
    md = cluster.nodes[0].metadata()
    for player in ("p0011", "p0123", "p0250"):
        p = partition_for(player.encode(), P)
        holders = {n["node_id"] for n in md["nodes"]
                   if p in n["active"].get("players", []) or p in n["standby"].get("players", [])}
        (stranger,) = [n for n in cluster.nodes if n.node_id not in holders]  # 3 nodes, 2 copies
        sql = f"SELECT * FROM players WHERE player = '{player}'"
        got = adbc_query(stranger, sql)
        assert got.num_rows == 1 and rows_of(got) == rows_of(duck(db, sql))


def test_catalog_metadata(flight_cluster) -> None:
    cluster, _ = flight_cluster
    with flightsql.connect(uri(cluster.nodes[1])) as conn:
        info = conn.adbc_get_info()
        assert info["vendor_name"] == "Federator" and info["vendor_arrow_version"] == pa.__version__
        assert conn.adbc_get_table_types() == ["SYSTEM TABLE", "TABLE"]
        schema = conn.adbc_get_table_schema("players")
        assert [(f.name, f.type) for f in schema] == [
            ("player", pa.string()), ("team", pa.string()), ("games", pa.int64()), ("total_score", pa.int64()),
            ("best", pa.float64()), ("active", pa.bool_()), ("last_seen", pa.timestamp("ms", tz="UTC")),
            ("rowtime", pa.timestamp("ms", tz="UTC"))]
        assert schema.field("games").metadata[b"ARROW:FLIGHT:SQL:TYPE_NAME"] == b"BIGINT"
        (catalog,) = conn.adbc_get_objects().read_all().to_pylist()
        assert catalog["catalog_name"] == "federator"
        by_schema = {s["db_schema_name"]: s["db_schema_tables"] for s in catalog["catalog_db_schemas"]}
        assert sorted(by_schema) == ["information_schema", "main"]
        stores = {t["table_name"]: t for t in by_schema["main"]}
        assert sorted(stores) == ["players", "scores"] and stores["scores"]["table_type"] == "TABLE"
        assert [c["column_name"] for c in stores["scores"]["table_columns"]] == ["key", "score", "rowtime"]
        assert sorted(t["table_name"] for t in by_schema["information_schema"]) == ["columns", "tables"]
        (filtered,) = conn.adbc_get_objects(depth="tables", table_name_filter="sc%",
                                            table_types_filter=["TABLE"]).read_all().to_pylist()
        assert [[t["table_name"] for t in s["db_schema_tables"] or []] for s in filtered["catalog_db_schemas"]
                if s["db_schema_tables"]] == [["scores"]]
    # The system tables GetTables lists can be queried like stores.
    got = adbc_query(cluster.nodes[1], "SELECT table_name FROM information_schema.tables ORDER BY table_name")
    assert got.column("table_name").to_pylist() == ["players", "scores"]


@pytest.mark.parametrize(("sql", "params", "error", "code"), [
    ("SELEC player FROM players", None, adbc_driver_manager.ProgrammingError, "SQL_PARSE_ERROR"),
    ("SELECT * FROM nowhere", None, adbc_driver_manager.ProgrammingError, "UNKNOWN_STORE"),
    ("SELECT nothing FROM players", None, adbc_driver_manager.ProgrammingError, "UNKNOWN_COLUMN"),
    ("SELECT player FROM players WHERE player = ? AND team = ?", ["p0001"], adbc_driver_manager.ProgrammingError,
     "INVALID_PARAMETER"),
    ("SELECT * FROM read_parquet('/etc/passwd')", None, adbc_driver_manager.NotSupportedError,
     "UNSUPPORTED"),
    ("DELETE FROM players", None, adbc_driver_manager.NotSupportedError, "UNSUPPORTED"),
])
def test_errors_carry_the_http_code_and_message(flight_cluster, sql, params, error, code) -> None:
    cluster, _ = flight_cluster
    with pytest.raises(error) as info:
        adbc_query(cluster.nodes[0], sql, params)
    if params is None:  # the same request over HTTP gives the same code and message
        http = json.loads(post(cluster.nodes[0], {"sql": sql}).data)["error"]
        assert http["code"] == code
        assert f"{code}: {http['message']}" in str(info.value)
    else:
        assert f"{code}: " in str(info.value)


class _Headers(flight.ClientMiddlewareFactory):
    def __init__(self) -> None:
        self.received: dict = {}

    def start_call(self, info):
        factory = self

        class _M(flight.ClientMiddleware):
            def received_headers(self, headers):
                factory.received.update(headers)

        return _M()


def _statement(client: flight.FlightClient, sql: str, headers: list[tuple[bytes, bytes]]) -> pa.Table:
    """A plain CommandStatementQuery (no prepare), as JDBC and other clients send it."""
    opts = flight.FlightCallOptions(headers=headers)
    descriptor = flight.FlightDescriptor.for_command(protocol.pack(protocol.CommandStatementQuery(query=sql)))
    info = client.get_flight_info(descriptor, opts)
    table = client.do_get(info.endpoints[0].ticket, opts).read_all()
    assert table.schema == info.schema
    return table


def test_statement_query_and_consistency_token_headers(flight_cluster) -> None:
    cluster, _ = flight_cluster
    mw = _Headers()
    client = flight.connect(uri(cluster.nodes[2]), middleware=[mw])
    sql = "SELECT player FROM players WHERE player = 'p0042'"
    assert _statement(client, sql, []).column("player").to_pylist() == ["p0042"]
    (token,) = mw.received["x-federator-consistency-token"]
    pos = Position.from_token(token)
    (topic,) = pos.topics()
    assert topic.endswith("-players-changelog") and partition_for(b"p0042", P) in pos.partitions(topic)
    # Passing the token back reads at least that fresh; a token from the future is NOT_UP_TO_BOUND.
    assert _statement(client, sql, [(b"x-federator-consistency-token", token.encode())]).num_rows == 1
    ahead = Position({topic: {p: o + 1000 for p, o in pos.partitions(topic).items()}}).to_token()
    with pytest.raises(flight.FlightUnavailableError, match="^NOT_UP_TO_BOUND: "):
        _statement(client, sql, [(b"x-federator-consistency-token", ahead.encode()),
                                 (b"x-federator-timeout-ms", b"800")])
    with pytest.raises(pa.ArrowInvalid, match="^INVALID_PARAMETER: .*consistency token"):
        _statement(client, sql, [(b"x-federator-consistency-token", b"garbage!")])
    assert _statement(client, sql, [(b"x-federator-allow-stale", b"true"), (b"x-federator-max-lag", b"10")]).num_rows == 1
    with pytest.raises(pa.ArrowInvalid, match="^INVALID_PARAMETER: header x-federator-allow-stale"):
        _statement(client, sql, [(b"x-federator-allow-stale", b"maybe")])
    # GetPrimaryKeys: a store's key column.
    cmd = protocol.pack(protocol.CommandGetPrimaryKeys(table="players"))
    info = client.get_flight_info(flight.FlightDescriptor.for_command(cmd))
    keys = client.do_get(info.endpoints[0].ticket).read_all().to_pylist()
    assert [(k["table_name"], k["column_name"], k["key_sequence"]) for k in keys] == [("players", "player", 1)]
    client.close()


def test_sigterm_stops_the_flight_server_cleanly(flight_cluster) -> None:
    # Last in the module: it takes a node away, with a client connection still open to it.
    cluster, _ = flight_cluster
    node = cluster.nodes[2]
    conn = flightsql.connect(uri(node))
    cur = conn.cursor()
    cur.execute("SELECT COUNT(*) FROM scores")
    assert cur.fetchall() == [(60,)]
    assert node.stop(signal.SIGTERM) == 0
    with pytest.raises(adbc_driver_manager.OperationalError, match="Unavailable"):
        adbc_query(node, "SELECT COUNT(*) FROM players")
    with contextlib.suppress(adbc_driver_manager.Error):  # closing tells the gone server; it cannot hear
        cur.close()
    with contextlib.suppress(adbc_driver_manager.Error):
        conn.close()
