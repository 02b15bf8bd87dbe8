"""SQL over HTTP on a three-node cluster, every answer compared with DuckDB over the same rows."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import math
import random
import re
import signal
import struct
import uuid

import duckdb
import pyarrow as pa
import pytest
import urllib3

from federator.partitioner import partition_for
from federator.store.layout import window_key
from tests.integration.changelog_util import produce, register
from tests.integration.cluster import Cluster, scrape, total, wait_for

P = 8
HTTP = urllib3.PoolManager()
BASE = 1_700_000_000_000 - 1_700_000_000_000 % 60_000


def ts(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc)


@pytest.fixture(scope="module")
def sql_cluster(broker, tmp_path_factory):
    app_id = f"sql{uuid.uuid4().hex[:8]}"
    rnd = random.Random(42)
    players = register(broker, app_id, {
        "name": "players", "type": "kv", "partitions": P, "key": {"name": "player", "format": "string"},
        "value": {"format": "json", "fields": [
            {"name": "team", "type": "string"}, {"name": "games", "type": "long"},
            {"name": "total_score", "type": "long"}, {"name": "best", "type": "double"},
            {"name": "active", "type": "boolean"}, {"name": "last_seen", "type": "timestamp"}]},
    })
    rows = []
    for i in range(600):
        r = {
            "player": f"p{i:04d}",
            "team": rnd.choice(["red", "blue", "green", None, "Ünïcode"]),
            "games": rnd.choice([None, rnd.randrange(0, 50)]),
            "total_score": rnd.randrange(-500, 5000),
            "best": rnd.choice([None, round(rnd.uniform(-10, 100), 3)]),
            "active": rnd.choice([True, False, None]),
            "last_seen": BASE + rnd.randrange(0, 86_400_000),
        }
        rows.append(r)
    produce(broker, players.topic, P, [
        (r["player"].encode(), r["player"].encode(), players.value.serialize({k: v for k, v in r.items() if k != "player"}), r["last_seen"])
        for r in rows])
    scores = register(broker, app_id, {"name": "scores", "type": "kv", "partitions": P, "key": {"format": "long"},
                                       "value": {"name": "score", "format": "double"}})
    score_rows = [{"key": k, "score": k * 1.5} for k in range(-300, 300, 3)]
    produce(broker, scores.topic, P, [(scores.key.serialize(r["key"]),) * 2 + (scores.value.serialize(r["score"]), 1) for r in score_rows])
    bonus = register(broker, app_id, {"name": "bonus", "type": "kv", "partitions": P,
                                      "key": {"name": "player", "format": "string"},
                                      "value": {"name": "bonus", "format": "long"}})
    bonus_rows = [{"player": f"p{i:04d}", "bonus": i % 13} for i in range(0, 700, 2)]  # half the players, and more
    produce(broker, bonus.topic, P, [(r["player"].encode(), r["player"].encode(), bonus.value.serialize(r["bonus"]), 1)
                                     for r in bonus_rows])
    minutes = register(broker, app_id, {"name": "per_minute", "type": "window", "partitions": P, "key": {"name": "player", "format": "string"},
                                        "value": {"name": "points", "format": "long"}, "window_size_ms": 60_000})
    win_rows = []
    for i in range(40):
        for m in range(6):
            win_rows.append({"player": f"p{i:04d}", "window_start": BASE + m * 60_000, "points": (i * m) % 17})
    produce(broker, minutes.topic, P, [
        (r["player"].encode(), window_key(r["player"].encode(), r["window_start"]), minutes.value.serialize(r["points"]), r["window_start"])
        for r in win_rows])

    # one node on each HTTP server: every query here also crosses a mixed granian/loop/waitress cluster
    c = Cluster(broker.bootstrap_servers, app_id, tmp_path_factory.mktemp("sqlnodes"), size=3, standby_replicas=1,
                servers={0: "granian", 1: "loop", 2: "waitress"})
    c.start()
    for store in ("players", "scores", "per_minute", "bonus"):
        c.wait_settled(store, P, timeout=60)

    db = duckdb.connect()
    t_players = pa.table({
        "player": [r["player"] for r in rows], "team": [r["team"] for r in rows],
        "games": pa.array([r["games"] for r in rows], pa.int64()),
        "total_score": pa.array([r["total_score"] for r in rows], pa.int64()),
        "best": pa.array([r["best"] for r in rows], pa.float64()),
        "active": pa.array([r["active"] for r in rows], pa.bool_()),
        "last_seen": pa.array([ts(r["last_seen"]) for r in rows], pa.timestamp("ms", tz="UTC")),
    })
    t_scores = pa.table({"key": pa.array([r["key"] for r in score_rows], pa.int64()),
                         "score": pa.array([r["score"] for r in score_rows], pa.float64())})
    t_minutes = pa.table({
        "player": [r["player"] for r in win_rows],
        "window_start": pa.array([ts(r["window_start"]) for r in win_rows], pa.timestamp("ms", tz="UTC")),
        "window_end": pa.array([ts(r["window_start"] + 60_000) for r in win_rows], pa.timestamp("ms", tz="UTC")),
        "points": pa.array([r["points"] for r in win_rows], pa.int64()),
    })
    db.register("players", t_players)
    db.register("scores", t_scores)
    db.register("per_minute", t_minutes)
    db.register("bonus", pa.table({"player": [r["player"] for r in bonus_rows],
                                   "bonus": pa.array([r["bonus"] for r in bonus_rows], pa.int64())}))
    db.execute("SET TimeZone = 'UTC'")
    yield c, db
    c.stop()


def post(node, body: dict, headers: dict | None = None):
    return HTTP.request("POST", f"http://{node.endpoint}/v1/sql", body=json.dumps(body).encode(),
                        headers={"Content-Type": "application/json", **(headers or {})})


def sql_arrow(node, sql: str, params: list | None = None, **extra) -> tuple[pa.Table, dict]:
    resp = post(node, {"sql": sql, "parameters": params or [], "format": "arrow", **extra})
    assert resp.status == 200, resp.data[:500]
    table = pa.ipc.open_stream(resp.data).read_all()
    return table, dict(resp.headers)


def sql_json(node, sql: str, params: list | None = None, **extra) -> dict:
    resp = post(node, {"sql": sql, "parameters": params or [], **extra})
    body = json.loads(resp.data)
    assert resp.status == 200, body
    return body


def duck(db, sql: str) -> pa.Table:
    rel = db.sql(sql)
    out = rel.to_arrow_table() if hasattr(rel, "to_arrow_table") else rel.arrow()
    return out.read_all() if hasattr(out, "read_all") else out


def norm(v):
    if isinstance(v, decimal.Decimal):
        v = int(v) if v == v.to_integral_value() else float(v)
    if isinstance(v, float):
        return None if math.isnan(v) else round(v, 6)
    if isinstance(v, dt.datetime) and v.tzinfo is None:
        return v.replace(tzinfo=dt.timezone.utc)
    return v


def rows_of(table: pa.Table) -> list[tuple]:
    return [tuple(norm(v) for v in row.values()) for row in table.to_pylist()]


def sort_key(row: tuple):
    return tuple((v is None, str(type(v)), v if v is not None else 0) for v in row)


QUERIES = [
    "SELECT * FROM players",
    "SELECT player, team, games FROM players WHERE player = 'p0007'",
    "SELECT main.players.player, players.team FROM main.players WHERE players.player IN ('p0001', 'p0002')",
    "SELECT player, total_score FROM players WHERE player IN ('p0001', 'p0100', 'p0599', 'nobody')",
    "SELECT player FROM players WHERE player >= 'p0100' AND player < 'p0120'",
    "SELECT player FROM players WHERE player BETWEEN 'p0100' AND 'p0105' OR player = 'p0500'",
    "SELECT player, best FROM players WHERE player LIKE 'p05%' AND best > 50",
    "SELECT player AS who, total_score * 2 + 1 AS twice, total_score / 7 AS ratio, -total_score AS neg FROM players WHERE total_score % 5 = 0",
    "SELECT player, CASE WHEN total_score > 2000 THEN 'high' WHEN total_score > 0 THEN 'mid' ELSE 'low' END AS band FROM players",
    "SELECT player, CAST(total_score AS DOUBLE) AS d, CAST(games AS VARCHAR) AS g, COALESCE(games, -1) AS g2 FROM players",
    "SELECT LOWER(team) AS l, UPPER(team) AS u, LENGTH(team) AS n, SUBSTR(player, 2, 3) AS s FROM players",
    "SELECT ABS(total_score) AS a, ROUND(best) AS r0, ROUND(best, 1) AS r1 FROM players",
    "SELECT player FROM players WHERE team IS NULL OR NOT active",
    "SELECT player FROM players WHERE team IS NOT NULL AND games IN (1, 2, 3) AND NOT (best < 10)",
    "SELECT player FROM players WHERE team LIKE '%e%' AND total_score NOT BETWEEN 100 AND 4000",
    "SELECT COUNT(*) AS n, COUNT(games) AS g, COUNT(DISTINCT team) AS t, SUM(total_score) AS s, MIN(best) AS mn, MAX(best) AS mx, AVG(total_score) AS av FROM players",
    "SELECT team, COUNT(*) AS n, SUM(games) AS g, AVG(best) AS b FROM players GROUP BY team",
    "SELECT team, active, COUNT(*) AS n FROM players GROUP BY team, active HAVING COUNT(*) > 10",
    "SELECT team, MAX(total_score) - MIN(total_score) AS spread FROM players WHERE games > 10 GROUP BY team",
    # a sum of integers is a HUGEINT however it is computed; unaliased columns have DuckDB's names
    "SELECT SUM(total_score) // COUNT(*), typeof(SUM(total_score)), hex(SUM(games)), gcd(SUM(games), 6), "
    "SUM(games) << 1 FROM players",
    "SELECT team, SUM(total_score) // COUNT(*), typeof(SUM(games)) FROM players GROUP BY team",
    "SELECT ALL + games, CAST(games AS VARCHAR), games != 3 FROM players",
    "SELECT typeof(SUM(b.bonus)), SUM(b.bonus) // 2 FROM players p JOIN bonus b ON p.player = b.player",
    "SELECT COUNT(*) AS n FROM players WHERE player = 'nobody'",
    "SELECT player, last_seen FROM players WHERE last_seen > TIMESTAMP '2023-11-15 00:00:00+00'",
    "SELECT key, score FROM scores WHERE key BETWEEN -20 AND 20",
    "SELECT key FROM scores WHERE key < -280 OR key > 290",
    "SELECT key, score FROM scores WHERE key BETWEEN -50 AND 10 OR key BETWEEN 0 AND 60 OR key > 280 OR key = -99",
    "SELECT SUM(score) AS s, COUNT(*) AS n FROM scores WHERE key >= -3",
    "SELECT player, window_start, window_end, points FROM per_minute WHERE player = 'p0003'",
    f"SELECT player, points FROM per_minute WHERE window_start >= TIMESTAMP '{ts(BASE + 120_000).isoformat()}' AND points > 10",
    "SELECT player, SUM(points) AS total FROM per_minute GROUP BY player HAVING SUM(points) > 20",
    # what BI tools and analysts send: wrappers, time grains, joins, CTEs, windows, set operations
    "SELECT team, COUNT(*) AS count FROM (SELECT * FROM players) AS virtual_table GROUP BY team LIMIT 10000",
    'SELECT "source"."team" AS "team", SUM("source"."total_score") AS "sum" FROM (SELECT "players"."team" AS "team", '
    '"players"."total_score" AS "total_score" FROM "players") AS "source" GROUP BY "source"."team" LIMIT 1048575',
    "SELECT DATE_TRUNC('hour', last_seen) AS __timestamp, COUNT(*) AS n FROM players GROUP BY DATE_TRUNC('hour', last_seen)",
    "SELECT DATE_TRUNC('week', last_seen) AS w, DATE_TRUNC('quarter', last_seen) AS q, COUNT(*) FROM players GROUP BY 1, 2",
    "SELECT EXTRACT(hour FROM last_seen) AS h, strftime(last_seen, '%Y-%m-%d %H') AS s, last_seen + INTERVAL 1 DAY AS d "
    "FROM players WHERE player < 'p0010'",
    "SELECT p.player, p.total_score, s.score FROM players p JOIN scores s ON p.games = s.key WHERE p.team = 'red'",
    "SELECT p.player, s.score FROM players p LEFT JOIN scores s ON p.games = s.key AND s.score > 10 WHERE p.player < 'p0050'",
    "WITH t AS (SELECT team, SUM(total_score) AS s FROM players GROUP BY team) SELECT team, s FROM t WHERE s > 0",
    "SELECT player, total_score, RANK() OVER (PARTITION BY team ORDER BY total_score DESC) AS r FROM players "
    "QUALIFY r <= 2",
    "SELECT player FROM players WHERE team = 'red' UNION ALL SELECT CAST(key AS VARCHAR) FROM scores WHERE key > 250",
    "SELECT player FROM players WHERE games IN (SELECT key FROM scores WHERE key BETWEEN 0 AND 20)",
    "SELECT player, total_score - (SELECT AVG(total_score) FROM players) AS diff FROM players WHERE player < 'p0020' ORDER BY player",
    "SELECT median(total_score) AS m, quantile_cont(best, 0.9) AS q FROM players",
    "SELECT team, regexp_matches(player, '7$') AS seven, lpad(CAST(games AS VARCHAR), 4, '0') AS g FROM players "
    "WHERE player < 'p0030'",
    "SELECT DISTINCT ON (team) team, player FROM players ORDER BY team, player",
    "SELECT team, active, COUNT(*) FROM players GROUP BY ROLLUP (team, active)",
    "SELECT a.player, b.player FROM players a JOIN players b ON a.total_score = b.total_score AND a.player < b.player",
    "SELECT COUNT(DISTINCT NULL), SUM(DISTINCT NULL) FROM players",
    "SELECT team, COUNT(DISTINCT NULL) FROM players GROUP BY team",
]

# Joins on the keys of co-partitioned stores (players and bonus: same partitions, string keys)
CO_JOINS = [
    "SELECT p.player, p.total_score, b.bonus FROM players p JOIN bonus b ON p.player = b.player WHERE b.bonus > 5",
    "SELECT p.player, b.bonus FROM players p LEFT JOIN bonus b ON p.player = b.player WHERE p.team = 'red'",
    "SELECT * FROM players JOIN bonus ON players.player = bonus.player WHERE players.player < 'p0100'",
    "SELECT p.team, SUM(b.bonus) AS s, COUNT(*) AS n, AVG(p.total_score) AS a FROM players p "
    "JOIN bonus b ON p.player = b.player GROUP BY p.team",
    "SELECT COUNT(*) FROM players p JOIN bonus b ON b.player = p.player AND b.bonus < p.games",
    "SELECT p.player, bonus * 2 AS twice FROM players p JOIN bonus b ON p.player = b.player "
    "WHERE p.player IN ('p0002', 'p0003', 'p0598')",
    # every key on both sides: the owners pair the two scans row by row
    "SELECT a.team, COUNT(*) AS n, SUM(b.total_score) AS s FROM players a JOIN players b ON a.player = b.player "
    "WHERE b.games > 3 GROUP BY a.team",
]

ORDERED = [
    "SELECT player, total_score FROM players ORDER BY total_score DESC, player LIMIT 10",
    "SELECT player, best FROM players ORDER BY best NULLS FIRST, player LIMIT 15 OFFSET 5",
    "SELECT player, best FROM players ORDER BY best DESC NULLS LAST, player LIMIT 7",
    "SELECT player, games FROM players ORDER BY games, player DESC LIMIT 20",
    "SELECT team, COUNT(*) AS n FROM players GROUP BY team ORDER BY n DESC, team NULLS FIRST",
    "SELECT key, score FROM scores ORDER BY key LIMIT 12",
    "SELECT key FROM scores WHERE key > -30 ORDER BY 1 DESC LIMIT 5",
    "SELECT key FROM scores ORDER BY key DESC LIMIT 9223372036854775807 OFFSET 2",
    "SELECT 100 AS c, key FROM scores ORDER BY 1, key DESC LIMIT 4",
    "SELECT COUNT(*) FROM (SELECT 7 AS c FROM scores ORDER BY 1 LIMIT 4)",
    "SELECT player AS p, total_score AS t FROM players ORDER BY t, p LIMIT 3",
]


@pytest.mark.parametrize("sql", QUERIES)
def test_answers_equal_duckdb(sql_cluster, sql) -> None:
    cluster, db = sql_cluster
    got, _ = sql_arrow(random.choice(cluster.nodes), sql)
    want = duck(db, sql)
    assert sorted(rows_of(got), key=sort_key) == sorted(rows_of(want), key=sort_key)
    assert got.schema.names == want.schema.names and got.schema.types == want.schema.types


@pytest.mark.parametrize("sql", CO_JOINS)
def test_co_partitioned_joins_run_on_the_owners_and_equal_duckdb(sql_cluster, sql) -> None:
    cluster, db = sql_cluster
    node = random.choice(cluster.nodes)
    got, _ = sql_arrow(node, sql)
    want = duck(db, sql)
    assert got.column_names == want.column_names
    assert sorted(rows_of(got), key=sort_key) == sorted(rows_of(want), key=sort_key)
    plan = sql_json(node, "EXPLAIN " + sql)
    assert all("join of co-partitioned players and " in row[1] for row in plan["rows"]), plan["rows"]
    lookup = "AND b.bonus < p.games" not in sql  # an ON of more than the keys stays DuckDB's join
    assert all(("join as a key lookup in Arrow" in row[4]) == lookup for row in plan["rows"]), plan["rows"]
    assert sql_json(node, sql)["stats"].get("joined_on_owners") is True


@pytest.mark.parametrize(("dialect", "sql", "duckdb_sql"), [
    ("postgres", "SELECT player, total_score::text AS t FROM players WHERE team ILIKE 'RED' ORDER BY player LIMIT 5",
     "SELECT player, CAST(total_score AS VARCHAR) AS t FROM players WHERE team ILIKE 'RED' ORDER BY player LIMIT 5"),
    ("mysql", "SELECT `team`, IFNULL(SUM(games), 0) AS g FROM players GROUP BY `team` ORDER BY g DESC LIMIT 2, 3",
     "SELECT team, COALESCE(SUM(games), 0) AS g FROM players GROUP BY team ORDER BY g DESC LIMIT 3 OFFSET 2"),
    ("snowflake", "SELECT player, IFF(total_score > 1000, 'hi', 'lo') AS band FROM players WHERE player < 'p0020' ORDER BY player",
     "SELECT player, CASE WHEN total_score > 1000 THEN 'hi' ELSE 'lo' END AS band FROM players WHERE player < 'p0020' ORDER BY player"),
])
def test_a_request_may_write_in_another_dialect(sql_cluster, dialect, sql, duckdb_sql) -> None:
    cluster, db = sql_cluster
    got = sql_json(cluster.nodes[0], sql, dialect=dialect)
    assert got["rows"] == [list(r) for r in db.execute(duckdb_sql).fetchall()]
    resp = post(cluster.nodes[0], {"sql": "SELECT 1", "dialect": "klingon"})
    assert resp.status == 400 and json.loads(resp.data)["error"]["code"] == "INVALID_PARAMETER"


def test_a_node_given_a_memory_limit_duckdb_refuses_exits_naming_the_flag(sql_cluster, tmp_path) -> None:
    from tests.integration.cluster import NodeProcess

    cluster, _ = sql_cluster
    node = NodeProcess(cluster.nodes[0].bootstrap, cluster.nodes[0].app_id, "badmem", tmp_path / "badmem")
    node.extra_args = ["--duckdb-memory-limit", "lots"]
    node.start(wait=False)
    try:
        assert node.proc.wait(60) != 0
    finally:
        node.stop(signal.SIGKILL)
    assert "--duckdb-memory-limit" in node.log.read_text()


def test_a_top_k_over_a_co_partitioned_join_is_cut_on_the_owners(sql_cluster) -> None:
    cluster, db = sql_cluster
    sql = ("SELECT p.player, p.total_score + b.bonus AS t FROM players p JOIN bonus b ON p.player = b.player "
           "ORDER BY t DESC, p.player LIMIT 5")
    got, _ = sql_arrow(cluster.nodes[1], sql)
    assert rows_of(got) == rows_of(duck(db, sql))


@pytest.mark.parametrize("sql", ORDERED)
def test_ordered_answers_equal_duckdb_in_order(sql_cluster, sql) -> None:
    cluster, db = sql_cluster
    got, _ = sql_arrow(random.choice(cluster.nodes), sql)
    want = duck(db, sql)
    assert rows_of(got) == rows_of(want)
    assert got.column_names == want.column_names


def test_parameters_and_point_queries_touch_one_partition(sql_cluster) -> None:
    cluster, _ = sql_cluster
    for node in cluster.nodes:
        body = sql_json(node, "SELECT player, total_score FROM players WHERE player = ?", ["p0042"])
        assert [r[0] for r in body["rows"]] == ["p0042"]
        assert body["stats"]["partitions_queried"] == 1 and body["stats"]["nodes"] == 1
        assert body["columns"][0] == {"name": "player", "type": "VARCHAR"}
    body = sql_json(cluster.nodes[0], "SELECT player FROM players WHERE player IN (?, ?)", ["p0001", "p0002"])
    parts = {partition_for(b"p0001", P), partition_for(b"p0002", P)}
    assert body["stats"]["partitions_queried"] == len(parts)


def test_a_routed_point_query_reads_the_owners_stored_entry(sql_cluster) -> None:
    """A node asked for a key it does not own fetches the key's stored bytes from the owner in
    the lean call (the owner counts a LocalKeyQuery), not a KeyQuery's Arrow rows."""
    cluster, db = sql_cluster
    key = "p0042"
    info = json.loads(HTTP.request("GET", f"http://{cluster.nodes[0].endpoint}/v1/stores/players").data)
    owner_id = info["partition_owners"][partition_for(key.encode(), P)]["active"]["node_id"]
    owner = next(n for n in cluster.nodes if n.node_id == owner_id)
    asker = next(n for n in cluster.nodes if n.node_id != owner_id)

    def counts() -> tuple[int, int]:
        q = owner.metadata()["local"]["store_queries"].get("players", {})
        return q.get("LocalKeyQuery", {}).get("queries", 0), q.get("KeyQuery", {}).get("queries", 0)

    before = counts()
    sql = "SELECT player, total_score FROM players WHERE player = ?"
    body = sql_json(asker, sql, [key])
    assert body["rows"] == [list(r) for r in db.execute(sql, [key]).fetchall()]
    local, key_queries = counts()
    assert (local - before[0], key_queries - before[1]) == (1, 0)
    assert body["stats"]["nodes"] == 1 and body["consistency_token"]


def test_a_repeated_query_with_other_parameters_is_answered_for_those(sql_cluster) -> None:
    """Plans are kept per SQL text and parameters: other parameters get their own plan and answer."""
    cluster, db = sql_cluster
    sql = "SELECT COUNT(*), SUM(total_score) FROM players WHERE total_score > ? AND player < ?"
    for params in ([0, "p0100"], [500, "p0100"], [500, "p0050"], [0, "p0100"], [1, "p0100"], [1.5, "p0100"]):
        for _ in range(2):
            got = sql_json(cluster.nodes[2], sql, params)["rows"]
            assert got == [list(r) for r in db.execute(sql, params).fetchall()], params
    flag = "SELECT COUNT(*) FROM players WHERE (total_score > 0) = ?"
    assert sql_json(cluster.nodes[0], flag, [True])["rows"] == [list(db.execute(flag, [True]).fetchone())]
    assert sql_json(cluster.nodes[0], flag, [False])["rows"] == [list(db.execute(flag, [False]).fetchone())]


def test_formats_json_ndjson_csv(sql_cluster) -> None:
    cluster, _ = sql_cluster
    node = cluster.nodes[1]
    sql = "SELECT player, last_seen, best FROM players WHERE player IN ('p0001', 'p0002') ORDER BY player"
    body = sql_json(node, sql)
    assert body["rows"][0][0] == "p0001" and isinstance(body["rows"][0][1], str) and "T" in body["rows"][0][1]
    assert body["consistency_token"]
    nd = post(node, {"sql": sql}, {"Accept": "application/x-ndjson"})
    assert nd.status == 200 and [json.loads(x)["player"] for x in nd.data.decode().splitlines()] == ["p0001", "p0002"]
    csv = post(node, {"sql": sql}, {"Accept": "text/csv"})
    assert csv.status == 200 and csv.data.decode().splitlines()[0].replace('"', "") == "player,last_seen,best"


def test_show_describe_explain(sql_cluster) -> None:
    cluster, db = sql_cluster
    node = cluster.nodes[2]
    assert [r[0] for r in sql_json(node, "SHOW TABLES")["rows"]] == ["bonus", "per_minute", "players", "scores"]
    cols = sql_json(node, "DESCRIBE players")["rows"]
    assert [c[0] for c in cols] == ["player", "team", "games", "total_score", "best", "active", "last_seen", "rowtime"]
    assert cols[2][1] == "BIGINT"
    plan = sql_json(node, "EXPLAIN SELECT team, COUNT(*) FROM players WHERE player = 'p0009' GROUP BY team")
    names = [c["name"] for c in plan["columns"]]
    assert names == ["store", "query", "partitions", "node", "pushed_down", "at_receiver"]
    (row,) = plan["rows"]
    assert "KeyQuery" in row[1] and row[2] == str(partition_for(b"p0009", P))
    assert "partial aggregate" in row[4] and "final aggregate" in row[5]
    tables = sql_json(node, "SELECT table_name, store_type FROM information_schema.tables ORDER BY table_name")
    assert tables["rows"] == [["bonus", "kv"], ["per_minute", "window"], ["players", "kv"], ["scores", "kv"]]
    cols = sql_json(node, "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'scores'")
    assert cols["rows"] == [["key", "BIGINT"], ["score", "DOUBLE"], ["rowtime", "TIMESTAMP WITH TIME ZONE"]]
    # the names information_schema gives are the names a BI tool writes back
    qualified = sql_json(node, "SELECT COUNT(*) FROM federator.main.scores")
    assert qualified["rows"] == sql_json(node, "SELECT COUNT(*) FROM scores")["rows"]
    assert sql_json(node, "SELECT COUNT(*) FROM federator.information_schema.tables")["rows"] == [[4]]


@pytest.mark.parametrize(("body", "status", "code"), [
    ({"sql": "SELEC player FROM players"}, 400, "SQL_PARSE_ERROR"),
    ({"sql": "SELECT player FROM players WHERE player = ?", "parameters": []}, 400, "INVALID_PARAMETER"),
    ({"sql": "SELECT * FROM nowhere"}, 404, "UNKNOWN_STORE"),
    ({"sql": "SELECT * FROM other.players"}, 404, "UNKNOWN_STORE"),
    ({"sql": "SELECT * FROM elsewhere.main.players"}, 404, "UNKNOWN_STORE"),
    ({"sql": "SELECT nothing FROM players"}, 404, "UNKNOWN_COLUMN"),
    ({"sql": "SELECT * FROM read_csv('/etc/passwd')"}, 422, "UNSUPPORTED"),
    ({"sql": "SELECT CAST(team AS INTEGER) FROM players"}, 400, "INVALID_DATA"),
    ({"sql": "SELECT key FROM scores WHERE CAST(CAST(key AS VARCHAR) || 'x' AS INTEGER) > 0"}, 400, "INVALID_DATA"),
    ({"sql": "DELETE FROM players"}, 422, "UNSUPPORTED"),
    ({"sql": "SELECT + team FROM players"}, 400, "SQL_PARSE_ERROR"),  # DuckDB has no + of a VARCHAR
    ({"sql": "SELECT player FROM players", "consistency_token": "garbage!"}, 400, "INVALID_PARAMETER"),
])
def test_errors(sql_cluster, body, status, code) -> None:
    cluster, _ = sql_cluster
    resp = post(cluster.nodes[0], body)
    err = json.loads(resp.data)["error"]
    assert resp.status == status and err["code"] == code, err
    assert err["message"]


def test_parse_error_has_line_and_column(sql_cluster) -> None:
    cluster, _ = sql_cluster
    err = json.loads(post(cluster.nodes[0], {"sql": "SELECT player\nFROM players WHERE (player = 'x'"}).data)["error"]
    assert err["code"] == "SQL_PARSE_ERROR" and err["line"] == 2 and err["col"] > 0


def test_a_token_from_the_future_is_not_up_to_bound(sql_cluster) -> None:
    cluster, _ = sql_cluster
    body = sql_json(cluster.nodes[0], "SELECT player FROM players WHERE player = 'p0001'")
    from federator.query.position import Position

    pos = Position.from_token(body["consistency_token"])
    (topic,) = pos.topics()
    ahead = Position({topic: {p: o + 1000 for p, o in pos.partitions(topic).items()}})
    resp = post(cluster.nodes[0], {"sql": "SELECT player FROM players WHERE player = 'p0001'",
                                   "consistency_token": ahead.to_token(), "timeout_ms": 800})
    assert resp.status == 409 and json.loads(resp.data)["error"]["code"] == "NOT_UP_TO_BOUND"


def test_read_your_writes_with_the_writers_token(sql_cluster, broker) -> None:
    cluster, _ = sql_cluster
    from federator import kafka
    from federator.query.position import Position

    topic = f"{cluster.nodes[0].app_id}-scores-changelog"
    producer = kafka.producer(broker.bootstrap_servers)
    key = (12345).to_bytes(8, "big", signed=True)
    offsets = {}

    def done(err, msg):
        offsets[msg.partition()] = msg.offset()

    producer.produce(topic, key=key, value=struct.pack(">d", 7.25), partition=partition_for(key, P), on_delivery=done)
    producer.flush(10)
    token = Position({topic: offsets}).to_token()
    body = sql_json(cluster.nodes[2], "SELECT score FROM scores WHERE key = 12345", consistency_token=token)
    assert body["rows"] == [[7.25]]
    assert Position.from_token(body["consistency_token"]).get(topic, partition_for(key, P)) >= offsets[partition_for(key, P)]


def test_kept_scans_and_aggregates_follow_later_updates_inserts_and_deletes(sql_cluster, broker) -> None:
    """Each shard keeps its last full scan and brings it, and the counts and integer sums kept
    beside it, up to date with the writes that come after; answers read with the writer's token
    hold every update, insert and delete."""
    from federator import kafka
    from federator.query.position import Position

    cluster, _ = sql_cluster
    q = "SELECT key, score FROM scores"
    agg = "SELECT key % 3 AS g, COUNT(*) AS n, SUM(key) AS s, AVG(key) AS a FROM scores GROUP BY g ORDER BY g"
    before = {k: s for k, s in sql_json(cluster.nodes[0], q)["rows"]}
    # counts, sums and maxima of plain columns are kept and follow the written rows alone
    # (owner/maintained.py; the new key is the largest, so the maximum follows it)
    counts = "SELECT COUNT(*) AS n, SUM(key) AS s, COUNT(score) AS c, MAX(key) AS m, SUM(key) // COUNT(*) AS q, " \
             "typeof(SUM(key)) AS t FROM scores"
    for n in cluster.nodes:
        sql_json(n, "SELECT COUNT(*), SUM(score) FROM scores")  # every shard's scan kept, with its aggregate
        sql_json(n, agg)
        sql_json(n, counts)

    def cache_stat(name: str) -> int:
        return sum(n.metadata()["local"]["scan_cache"][name] for n in cluster.nodes)

    followed_before, maintained_before = cache_stat("followed"), cache_stat("maintained")
    topic = f"{cluster.nodes[0].app_id}-scores-changelog"
    writes = {-300: 99.5, -297: None, 7_000_001: 1.25}  # an update, a delete, a new key
    producer = kafka.producer(broker.bootstrap_servers)
    offsets: dict[int, int] = {}

    def done(err, msg):
        assert err is None, err
        offsets[msg.partition()] = max(offsets.get(msg.partition(), -1), msg.offset())

    for k, v in writes.items():
        kb = k.to_bytes(8, "big", signed=True)
        producer.produce(topic, key=kb, value=None if v is None else struct.pack(">d", v),
                         partition=partition_for(kb, P), on_delivery=done)
    assert producer.flush(10) == 0
    token = Position({topic: offsets}).to_token()
    expected = {**before, **{k: v for k, v in writes.items() if v is not None}}
    del expected[-297]
    rows = pa.table({"key": pa.array(list(expected), pa.int64()), "score": list(expected.values())})
    want = [list(r) for r in duckdb.connect().execute(agg.replace("FROM scores", "FROM rows")).fetchall()]
    # the followed sum is still a HUGEINT: // divides integers
    want_counts = [[len(expected), sum(expected), len(expected), max(expected), sum(expected) // len(expected),
                    "HUGEINT"]]
    for n in cluster.nodes:  # the followed counts first, while no scan has been brought up to date
        assert sql_json(n, counts, consistency_token=token)["rows"] == want_counts
    assert cache_stat("maintained") > maintained_before  # from the written rows, not every row
    for n in cluster.nodes:  # the aggregates next: over the kept scans brought up to date
        assert sql_json(n, agg, consistency_token=token)["rows"] == want
    for n in cluster.nodes:
        assert {k: s for k, s in sql_json(n, q, consistency_token=token)["rows"]} == expected
    n, total = sql_json(cluster.nodes[1], "SELECT COUNT(*), SUM(score) FROM scores", consistency_token=token)["rows"][0]
    assert n == len(expected) and total == pytest.approx(sum(expected.values()))
    assert cache_stat("followed") > followed_before  # brought up to date, not read again


def test_timeout_ms_bounds_a_statement_that_reads_no_store_from_planning_on(sql_cluster) -> None:
    """Planning binds the statement by running it over empty stores; one that reads none (here
    a cross join of ranges that would run for hours) runs whole there, within timeout_ms too:
    the 504 comes long before the client's own 8 s read timeout (planning once allowed 10 s)."""
    cluster, _ = sql_cluster
    resp = HTTP.request("POST", f"http://{cluster.nodes[0].endpoint}/v1/sql",
                        body=json.dumps({"sql": "SELECT COUNT(*) FROM range(100000) a, range(100000) b WHERE a.range + b.range = -1",
                                         "timeout_ms": 300}).encode(),
                        headers={"Content-Type": "application/json"}, timeout=urllib3.Timeout(connect=5, read=8),
                        retries=False)
    assert resp.status == 504 and json.loads(resp.data)["error"]["code"] == "TIMEOUT", resp.data[:300]


@pytest.mark.parametrize("statement", [
    "SELECT COUNT(*) AS n, SUM(key) AS s, MIN(key) AS lo, MAX(key) AS hi FROM scores",
    "SELECT key % 3 AS g, COUNT(*) AS n, SUM(key) AS s FROM scores GROUP BY g ORDER BY g DESC",
    "SELECT key, score FROM scores ORDER BY key DESC LIMIT 7",
])
def test_merges_of_states_and_top_k_cuts_are_finished_in_arrow_as_duckdb_answers(sql_cluster, statement) -> None:
    """Over two real nodes: the receiver merges the owners' states (or cuts their top rows) in
    Arrow, and the answer is DuckDB's over the same rows."""
    cluster, _ = sql_cluster
    node = cluster.nodes[1]
    got = sql_json(node, statement)
    assert got["stats"].get("finished_in_arrow") is True, got["stats"]
    rows = sql_json(node, "SELECT key, score FROM scores", consistency_token=got["consistency_token"])["rows"]
    table = pa.table({"key": pa.array([k for k, _ in rows], pa.int64()), "score": pa.array([v for _, v in rows])})
    con = duckdb.connect()
    con.register("scores", table)
    assert got["rows"] == [list(r) for r in con.execute(statement).fetchall()]


def test_a_repeated_statement_reuses_its_answer_until_a_store_changes(sql_cluster, broker) -> None:
    """The receiver keeps a deterministic statement's answer with the positions of the rows it
    read: the same statement over partitions at the same positions is answered from it; a
    write moves a position and the statement runs again; random() is never reused."""
    from federator import kafka
    from federator.query.position import Position

    cluster, _ = sql_cluster
    node = cluster.nodes[1]
    # HAVING keeps it in DuckDB (a plain merge of the owners' states is finished in Arrow, never kept)
    agg = ("SELECT key % 5 AS g, COUNT(*) AS n, SUM(key) AS s FROM scores WHERE key > -250 GROUP BY g "
           "HAVING COUNT(*) > 0 ORDER BY g")
    first, second = sql_json(node, agg), sql_json(node, agg)
    assert not first["stats"].get("answer_reused") and second["stats"].get("answer_reused")
    assert second["rows"] == first["rows"] and second["consistency_token"] == first["consistency_token"]
    volatile = "SELECT COUNT(*) + CAST(random() * 0 AS BIGINT) FROM scores"
    assert not any(sql_json(node, volatile)["stats"].get("answer_reused") for _ in range(2))

    topic = f"{cluster.nodes[0].app_id}-scores-changelog"
    kb = (8_000_003).to_bytes(8, "big", signed=True)
    offsets: dict[int, int] = {}
    producer = kafka.producer(broker.bootstrap_servers)
    producer.produce(topic, key=kb, value=struct.pack(">d", 2.5), partition=partition_for(kb, P),
                     on_delivery=lambda err, msg: offsets.__setitem__(msg.partition(), msg.offset()))
    assert producer.flush(10) == 0
    token = Position({topic: offsets}).to_token()
    third = sql_json(node, agg, consistency_token=token)
    assert not third["stats"].get("answer_reused")
    rows = pa.table({"key": pa.array([k for k, _ in sql_json(node, "SELECT key, score FROM scores",
                                                             consistency_token=token)["rows"]], pa.int64())})
    assert third["rows"] == [list(r) for r in duckdb.connect().execute(agg.replace("FROM scores", "FROM rows")).fetchall()]
    assert [g for g in third["rows"] if g[0] == 8_000_003 % 5][0][1] == [g for g in first["rows"] if g[0] == 8_000_003 % 5][0][1] + 1


def test_a_statement_over_unchanged_partitions_is_answered_without_asking_their_owners(sql_cluster, broker) -> None:
    """The receiver learns where the other nodes' partitions are from their positions watches:
    while none has moved, a statement it computed is answered again without a call to any
    owner; a write to a partition another node owns reaches the next answers, with no token,
    once that owner has applied it."""
    from federator import kafka

    cluster, _ = sql_cluster
    node = cluster.nodes[1]
    top = "SELECT key, score FROM scores WHERE score > -1000 ORDER BY score DESC, key LIMIT 3"  # a top-k cut in Arrow
    count = "SELECT COUNT(*) AS n, SUM(score) AS s FROM scores WHERE score > -1000"  # a merge of states in Arrow
    first = {sql: sql_json(node, sql) for sql in (top, count)}
    assert all(not a["stats"].get("answer_reused") for a in first.values())
    # the watches open with the first statements: the answers are reused once they report
    wait_for(lambda: sql_json(node, top)["stats"].get("answer_reused"), timeout=10, what="a reused top-k")
    before = scrape(node)
    again = {sql: sql_json(node, sql) for sql in (top, count) for _ in range(3)}
    after = scrape(node)
    assert total(after, "federator_internal_calls_total") == total(before, "federator_internal_calls_total")
    for sql, answer in again.items():
        assert answer["stats"]["answer_reused"] and answer["stats"]["partitions_queried"] == 0
        assert answer["rows"] == first[sql]["rows"] and answer["consistency_token"] == first[sql]["consistency_token"]

    owners = cluster.active_map("scores", via=node)
    key = next(k for k in range(9_000_001, 9_100_000)
               if owners[partition_for(k.to_bytes(8, "big", signed=True), P)] != node.node_id)
    kb = key.to_bytes(8, "big", signed=True)
    producer = kafka.producer(broker.bootstrap_servers)
    producer.produce(f"{cluster.nodes[0].app_id}-scores-changelog", key=kb, value=struct.pack(">d", 1e9),
                     partition=partition_for(kb, P))
    assert producer.flush(10) == 0
    got = wait_for(lambda: (a := sql_json(node, top))["rows"][0] == [key, 1e9] and a, timeout=10,
                   what="the new top score in the answer")
    assert not got["stats"].get("answer_reused")
    rows = sql_json(node, "SELECT key, score FROM scores ORDER BY score DESC, key LIMIT 3",
                    consistency_token=got["consistency_token"])["rows"]
    assert got["rows"] == rows
    n, s = sql_json(node, count)["rows"][0]
    assert n == first[count]["rows"][0][0] + 1 and s == pytest.approx(first[count]["rows"][0][1] + 1e9)


def test_a_query_racing_a_node_stop_is_right_or_unavailable(sql_cluster) -> None:
    cluster, db = sql_cluster
    want = db.execute("SELECT COUNT(*), SUM(total_score) FROM players").fetchone()
    victim = cluster.nodes[1]
    victim.stop(signal.SIGKILL)
    outcomes = []
    try:
        for _ in range(15):
            node = cluster.nodes[0]
            resp = post(node, {"sql": "SELECT COUNT(*) AS n, SUM(total_score) AS s FROM players", "timeout_ms": 3000})
            body = json.loads(resp.data)
            if resp.status == 200:
                assert tuple(body["rows"][0]) == tuple(want)
                outcomes.append("ok")
            else:  # no partial answer: a failure naming the partitions that did not answer
                assert resp.status == 503 and body["error"]["code"] == "UNAVAILABLE", body
                assert resp.headers.get("Retry-After")
                missing = body["error"].get("partitions")
                assert missing and set(missing) <= set(range(P)), body
                assert all(f"partition {p}:" in body["error"]["message"] for p in missing), body
                outcomes.append("503")
    finally:
        victim.start()
        cluster.wait_settled("players", P, timeout=60)
    assert "ok" in outcomes


def test_rest_store_views_and_routed_point_lookup(sql_cluster) -> None:
    cluster, _ = sql_cluster
    node = cluster.nodes[0]
    resp = HTTP.request("GET", f"http://{node.endpoint}/v1/stores")
    stores = json.loads(resp.data)["stores"]
    assert resp.status == 200 and [s["name"] for s in stores] == ["bonus", "per_minute", "players", "scores"]
    info = json.loads(HTTP.request("GET", f"http://{node.endpoint}/v1/stores/players").data)
    owners = info["partition_owners"]
    assert [o["partition"] for o in owners] == list(range(P)) and all(o["active"] for o in owners)
    # a key owned elsewhere is fetched from its owner
    key = next(f"p{i:04d}" for i in range(600) if owners[partition_for(f"p{i:04d}".encode(), P)]["active"]["node_id"] != node.node_id)
    resp = HTTP.request("GET", f"http://{node.endpoint}/v1/stores/players/keys/{key}")
    assert resp.status == 200 and json.loads(resp.data)["player"] == key
    # the row SQL answers, value for value (timestamps included)
    body = json.loads(HTTP.request("POST", f"http://{node.endpoint}/v1/sql", json={
        "sql": "SELECT * FROM players WHERE player = ?", "parameters": [key]}).data)
    assert json.loads(resp.data) == dict(zip([c["name"] for c in body["columns"]], body["rows"][0]))
    missing = HTTP.request("GET", f"http://{node.endpoint}/v1/stores/players/keys/nobody")
    assert missing.status == 404
    unknown = HTTP.request("GET", f"http://{node.endpoint}/v1/stores/nope")
    assert unknown.status == 404 and json.loads(unknown.data)["error"]["code"] == "UNKNOWN_STORE"


def test_the_sql_command_prints_a_table(sql_cluster) -> None:
    import subprocess

    from tests.conftest import federator_cmd

    cluster, _ = sql_cluster
    r = subprocess.run(
        federator_cmd("sql", "--url", f"http://{cluster.nodes[2].endpoint}",
                      "SELECT player, total_score FROM players WHERE player IN (?, ?) ORDER BY player",
                      "--param", "p0001", "--param", "p0002"),
        capture_output=True, text=True, timeout=60,
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["player", "total_score"] and lines[2].split()[0] == "p0001" and "(2 rows" in r.stdout
    bad = subprocess.run(federator_cmd("sql", "--url", f"http://{cluster.nodes[2].endpoint}", "SELECT * FROM nope"),
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "UNKNOWN_STORE" in bad.stderr


def test_metrics_count_queries_by_kind_and_outcome_and_show_the_partitions(sql_cluster) -> None:
    cluster, _ = sql_cluster
    node = cluster.nodes[0]
    before = scrape(node)
    sql_json(node, "SELECT * FROM players WHERE player = ?", ["p0007"])
    sql_json(node, "SELECT player, team FROM players WHERE games > 10")
    sql_json(node, "SELECT team, COUNT(*) AS n, SUM(total_score) AS s FROM players GROUP BY team")
    sql_json(node, CO_JOINS[0])
    assert post(node, {"sql": "SELEC team FROM players"}).status == 400
    after = scrape(node)

    def moved(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    for kind in ("point", "scan", "aggregate", "join"):
        assert moved("federator_sql_queries_total", kind=kind, outcome="ok") == 1, kind
        assert moved("federator_sql_query_duration_seconds_count", kind=kind) == 1, kind
    assert moved("federator_sql_queries_total", outcome="SQL_PARSE_ERROR") == 1
    assert moved("federator_sql_queries_total") == 5
    # the scans read partitions the other two nodes own
    assert moved("federator_internal_calls_total", call="query", outcome="ok") >= 2
    assert moved("federator_store_queries_total", store="players") >= 1

    applied: set[str] = set()
    lagged: set[str] = set()
    for n in cluster.nodes:
        got = scrape(n) if n is not node else after
        for store in ("players", "scores", "bonus", "per_minute"):
            states = {s: total(got, "federator_partitions", store=store, state=s)
                      for s in ("active", "restoring", "uncovered")}
            assert sum(states.values()) == P and states["uncovered"] == 0, (store, states)
        assert total(got, "federator_node_info", node_id=n.node_id) == 1
        applied |= {dict(ls)["partition"] for (name, ls) in got
                    if name == "federator_records_applied_total" and dict(ls)["store"] == "players"}
        lagged |= {dict(ls)["partition"] for (name, ls) in got
                   if name == "federator_partition_lag_records" and dict(ls)["store"] == "players"}
    # every partition has a copy somewhere, with its series
    assert applied == lagged == {str(p) for p in range(P)}


def test_the_loop_server_answers_as_the_flask_routes(sql_cluster) -> None:
    """n1 runs `--server loop`: its answers given on the loop (the keys it owns, asked a second
    time, once planned; a kept answer) are byte for byte n0's (granian, Flask's routes) but for
    the time taken; so are its routed ones, a REST lookup, an error body and the console; a scan
    streams as Arrow and NDJSON; the loop's point queries are counted like any."""
    cluster, db = sql_cluster
    n0, n1 = cluster.nodes[0], cluster.nodes[1]
    info = json.loads(HTTP.request("GET", f"http://{n0.endpoint}/v1/stores/players").data)
    owner = {o["partition"]: o["active"]["node_id"] for o in info["partition_owners"]}
    local = next(f"p{i:04d}" for i in range(600) if owner[partition_for(f"p{i:04d}".encode(), P)] == "n1")
    routed = next(f"p{i:04d}" for i in range(600) if owner[partition_for(f"p{i:04d}".encode(), P)] == "n2")
    timed = re.compile(rb'"elapsed_ms":[0-9.e-]+')

    def asked(path: str, method: str = "GET", body: dict | None = None) -> list:
        return [HTTP.request(method, f"http://{n.endpoint}{path}", json=body) for n in (n0, n1, n1)]

    def same(path: str, method: str = "GET", body: dict | None = None, untimed: bool = False,
             answers: list | None = None) -> bytes:
        answers = answers or asked(path, method, body)
        datas = [timed.sub(b'"elapsed_ms":0', a.data) if untimed else a.data for a in answers]
        assert {(a.status, a.headers["Content-Type"]) for a in answers} == {(answers[0].status, answers[0].headers["Content-Type"])}
        assert datas[0] == datas[1] == datas[2], (path, body, datas)
        return answers[0].data

    before = scrape(n1)
    for key in (local, routed, "nobody"):
        same("/v1/sql", "POST", {"sql": "SELECT * FROM players WHERE player = ?", "parameters": [key]}, untimed=True)
        same(f"/v1/stores/players/keys/{key}")
    after = scrape(n1)

    def moved(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    assert moved("federator_sql_queries_total", kind="point", outcome="ok") == 12  # n1 was asked each of the
    # three keys twice, by SQL and by lookup: on the loop or not
    # the keys another node owns were read from their owner on n1's loop (their statements planned
    # by the local key's first ask, on n1's threads)
    far = 1 if owner[partition_for(b"nobody", P)] == "n1" else 2
    assert moved("federator_loop_server_requests_total", route="sql", answered="from_owner") == 2 * far
    assert moved("federator_loop_server_requests_total", route="lookup", answered="from_owner") == 2 * far
    assert moved("federator_internal_calls_total", call="key", outcome="ok") == 4 * far
    # a statement's kept answer, still current: given on the loop too
    agg = {"sql": "SELECT team, COUNT(*) AS n FROM players GROUP BY team HAVING COUNT(*) > 0 ORDER BY team"}

    def all_kept() -> list | None:
        """Three answers kept, each given without asking an owner (its positions watched). A kept
        answer lives 5 s, and one over partitions not watched lately is given after asking them."""
        got = asked("/v1/sql", "POST", agg)
        stats = [json.loads(a.data)["stats"] for a in got]
        return got if all(st.get("answer_reused") and st["partitions_queried"] == 0 for st in stats) else None

    kept = wait_for(all_kept, 20, "three kept answers")
    assert json.loads(same("/v1/sql", "POST", agg, untimed=True, answers=kept))["stats"]["answer_reused"] is True
    assert json.loads(same("/v1/sql", "POST", {"sql": "SELECT nope FROM players"}))["error"]["code"] == "UNKNOWN_COLUMN"
    assert b"<html" in same("/").lower()
    sql = "SELECT player, total_score FROM players ORDER BY player"
    got, headers = sql_arrow(n1, sql)
    assert [tuple(r.values()) for r in got.to_pylist()] == db.execute(sql).fetchall()
    assert headers.get("X-Federator-Consistency-Token")
    nd = post(n1, {"sql": sql, "format": "ndjson"})
    assert [json.loads(x)["player"] for x in nd.data.decode().splitlines()] == [r["player"] for r in got.to_pylist()]


def test_the_loops_concurrent_routed_reads_each_get_their_own_keys_row(sql_cluster) -> None:
    """Many point queries at once to n1 (`--server loop`) for keys n2 owns: n1's loop sends them
    to n2's key port on one connection without waiting for the answers before them, and n2
    answers those that came together in one send; each answer is its own key's row, as the
    owner itself gives it, and every one was read from the owner on the loop."""
    from concurrent.futures import ThreadPoolExecutor

    cluster, _ = sql_cluster
    n1, n2 = cluster.nodes[1], cluster.nodes[2]
    info = json.loads(HTTP.request("GET", f"http://{n1.endpoint}/v1/stores/players").data)
    owner = {o["partition"]: o["active"]["node_id"] for o in info["partition_owners"]}
    keys = [f"p{i:04d}" for i in range(600) if owner[partition_for(f"p{i:04d}".encode(), P)] == "n2"][:60]
    point = "SELECT * FROM players WHERE player = ?"
    want = {k: sql_json(n2, point, [k])["rows"] for k in keys}  # the owner's own answers
    assert all(len(rows) == 1 and rows[0][0] == k for k, rows in want.items())
    sql_json(n1, point, [keys[0]])  # the text planned, on a thread: from now on read on the loop
    pool = urllib3.PoolManager(maxsize=16)
    before = scrape(n1)

    def ask(key: str) -> tuple[str, list]:
        resp = pool.request("POST", f"http://{n1.endpoint}/v1/sql", json={"sql": point, "parameters": [key]})
        assert resp.status == 200, resp.data
        return key, json.loads(resp.data)["rows"]

    with ThreadPoolExecutor(16) as threads:
        got = list(threads.map(ask, keys * 3))
    after = scrape(n1)
    assert [rows for _, rows in got] == [want[k] for k, _ in got]
    asked = total(after, "federator_loop_server_requests_total", route="sql", answered="from_owner") \
        - total(before, "federator_loop_server_requests_total", route="sql", answered="from_owner")
    assert asked == len(keys) * 3
