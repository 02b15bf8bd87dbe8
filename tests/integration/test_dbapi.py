"""The DB-API driver against a live three-node cluster, answers compared with DuckDB and /v1/sql."""

from __future__ import annotations

import datetime as dt
import json

import pyarrow as pa
import pytest
import urllib3

import federator.dbapi as dbapi
from federator.query.position import Position
from tests.conftest import free_port
from tests.integration.bi_cluster import BASE_MS, bi_cluster, ts  # noqa: F401 - bi_cluster is a fixture

pytestmark = pytest.mark.integration


def duck_rows(c, sql: str, params: list | None = None) -> list[tuple]:
    return [tuple(r) for r in c.db.execute(sql, params or []).fetchall()]


def v1_sql_arrow(node, sql: str) -> pa.Table:
    resp = urllib3.request("POST", f"http://{node.endpoint}/v1/sql", body=json.dumps({"sql": sql, "format": "arrow"}).encode(),
                           headers={"Content-Type": "application/json"})
    assert resp.status == 200, resp.data[:300]
    return pa.ipc.open_stream(resp.data).read_all()


def utc(rows: list[tuple]) -> list[tuple]:
    """DuckDB hands back datetimes in its session zone; compare instants."""
    return [tuple(v.astimezone(dt.timezone.utc) if isinstance(v, dt.datetime) else v for v in r) for r in rows]


def test_every_type_through_the_driver(bi_cluster) -> None:
    c = bi_cluster
    conn = dbapi.connect(c.url())
    cur = conn.cursor()
    cur.execute("SELECT player, team, games, score, active, last_seen FROM players ORDER BY player")
    got = cur.fetchall()
    assert got == utc(duck_rows(c, "SELECT player, team, games, score, active, last_seen FROM players ORDER BY player"))
    assert cur.rowcount == len(c.players) == len(got)
    assert [d[1] for d in cur.description] == ["VARCHAR", "VARCHAR", "BIGINT", "DOUBLE", "BOOLEAN", "TIMESTAMP WITH TIME ZONE"]
    assert [d[1] == t for d, t in zip(cur.description, [dbapi.STRING, dbapi.STRING, dbapi.NUMBER, dbapi.NUMBER,
                                                        dbapi.BOOLEAN, dbapi.DATETIME])] == [True] * 6
    # NULLs of every type came through as None, and real values as Python types
    for i, typ in enumerate([str, str, int, float, bool, dt.datetime]):
        values = [r[i] for r in got]
        assert None in values or i == 0
        assert all(isinstance(v, typ) for v in values if v is not None)
    assert all(r[5].tzinfo is not None and r[5].utcoffset() == dt.timedelta(0) for r in got if r[5] is not None)

    cur.execute("SELECT id, payload FROM blobs ORDER BY id")
    assert cur.fetchall() == duck_rows(c, "SELECT id, payload FROM blobs ORDER BY id")
    assert [d[1] for d in cur.description] == ["INTEGER", "BLOB"] and cur.description[1][1] == dbapi.BINARY

    cur.execute("SELECT player, window_start, window_end, points FROM per_minute WHERE player = ? ORDER BY window_start",
                ["p003"])
    assert cur.fetchall() == utc(duck_rows(c, "SELECT player, window_start, window_end, points FROM per_minute "
                                              "WHERE player = 'p003' ORDER BY window_start"))


def test_parameters_of_every_type(bi_cluster) -> None:
    c = bi_cluster
    cur = dbapi.connect(c.url()).cursor()
    sql = ("SELECT player FROM players WHERE team = ? AND games >= ? AND score > ? AND active = ? "
           "AND last_seen < ? AND player <> ? ORDER BY player")
    params = ["red", 3, -19.0, False, ts(BASE_MS + 3_000_000), "p099"]
    cur.execute(sql, params)
    want = duck_rows(c, sql, params)
    assert cur.fetchall() == want and want  # the filter kept some rows and dropped others
    assert len(want) < len(c.players)
    cur.execute("SELECT player FROM players WHERE player IN (?, ?) ORDER BY player LIMIT ? OFFSET ?",
                ["p001", "p002", 1, 1])
    assert cur.fetchall() == [("p002",)]
    cur.executemany("SELECT player, games FROM players WHERE player = ?", [["p007"], ["p008"], ["nobody"]])
    assert cur.fetchall() == duck_rows(c, "SELECT player, games FROM players WHERE player IN ('p007', 'p008') ORDER BY player")


@pytest.mark.parametrize(("sql", "params", "cls", "code"), [
    ("SELEC player FROM players", [], dbapi.ProgrammingError, "SQL_PARSE_ERROR"),
    ("SELECT player FROM players WHERE player = ?", [], dbapi.ProgrammingError, "INVALID_PARAMETER"),
    ("SELECT * FROM nowhere", [], dbapi.ProgrammingError, "UNKNOWN_STORE"),
    ("SELECT nothing FROM players", [], dbapi.ProgrammingError, "UNKNOWN_COLUMN"),
    ("SELECT * FROM read_csv('/etc/passwd')", [], dbapi.NotSupportedError, "UNSUPPORTED"),
    ("DELETE FROM players", [], dbapi.NotSupportedError, "UNSUPPORTED"),
    ("SELECT CAST(team AS INTEGER) FROM players", [], dbapi.DataError, "INVALID_DATA"),
])
def test_each_error_class_from_a_real_bad_request(bi_cluster, sql, params, cls, code) -> None:
    cur = dbapi.connect(bi_cluster.url()).cursor()
    with pytest.raises(cls) as info:
        cur.execute(sql, params)
    assert info.value.code == code and info.value.message and code in str(info.value)
    assert isinstance(info.value, dbapi.DatabaseError)
    if code == "SQL_PARSE_ERROR":
        assert info.value.line == 1 and info.value.col


def test_timeout_and_not_up_to_bound_are_operational_errors(bi_cluster) -> None:
    c = bi_cluster
    with pytest.raises(dbapi.OperationalError) as info:
        # a 1 ms statement timeout (timeout_ms 1; the driver still gives the connection itself at
        # least 0.5 s) cannot cover the calls to the other nodes' partitions: the service gives up
        # with 504 TIMEOUT, or 503 UNAVAILABLE when a node call ran out first (both OperationalError)
        dbapi.connect(c.url(), timeout=0.001).cursor().execute("SELECT COUNT(*) FROM players")
    assert (info.value.code, info.value.status) in (("TIMEOUT", 504), ("UNAVAILABLE", 503))
    conn = dbapi.connect(c.url())
    token = conn.cursor().execute("SELECT player FROM players").consistency_token
    pos = Position.from_token(token)
    (topic,) = pos.topics()
    ahead = Position({topic: {p: o + 1000 for p, o in pos.partitions(topic).items()}}).to_token()
    with pytest.raises(dbapi.OperationalError) as info:
        dbapi.connect(c.url(), token=ahead, timeout=0.8).cursor().execute("SELECT player FROM players WHERE player = 'p001'")
    assert info.value.code == "NOT_UP_TO_BOUND"


def test_failover_when_the_first_listed_node_is_down(bi_cluster) -> None:
    c = bi_cluster
    dead = f"127.0.0.1:{free_port()}"
    conn = dbapi.connect(f"http://{dead}," + ",".join(n.endpoint for n in c.nodes))
    assert conn.cursor().execute("SELECT COUNT(*) FROM players").fetchone() == (len(c.players),)
    with pytest.raises(dbapi.OperationalError) as info:
        dbapi.connect(f"http://{dead},127.0.0.1:{free_port()}").cursor().execute("SELECT 1")
    assert dead in str(info.value)


def test_the_connection_carries_its_token(bi_cluster) -> None:
    c = bi_cluster
    conn = dbapi.connect(c.url(c.nodes[1]))
    sent: list[str | None] = []
    request = conn._http.request

    def spy(method, url, body=None, **kw):  # what each request carried
        sent.append(json.loads(body)["consistency_token"])
        return request(method, url, body=body, **kw)

    conn._http.request = spy
    cur = conn.cursor()
    cur.execute("SELECT player FROM players WHERE player = 'p001'")
    first = cur.consistency_token
    assert first and sent == [None]
    cur.execute("SELECT id FROM blobs")
    assert sent[1] == first  # the first answer's token went out with the next statement
    both = Position.from_token(conn.consistency_token)
    assert sorted(t.rsplit("-", 2)[1] for t in both.topics()) == ["blobs", "players"]
    assert both.merge(Position.from_token(first)) == both  # never behind what was read before
    cur.execute("SELECT 1")
    assert sent[2] == conn.consistency_token  # a statement reading no store keeps the floor


def test_fetch_arrow_table_equals_v1_sql(bi_cluster) -> None:
    c = bi_cluster
    cur = dbapi.connect(c.url()).cursor()
    for sql in ("SELECT * FROM players ORDER BY player", "SELECT * FROM blobs ORDER BY id",
                "SELECT player, window_start, points FROM per_minute ORDER BY player, window_start"):
        got = cur.execute(sql).fetch_arrow_table()
        want = v1_sql_arrow(c.nodes[2], sql)
        assert got.equals(want), sql
        assert got.num_rows == cur.rowcount > 0
