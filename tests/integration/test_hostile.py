"""Hostile input to POST /v1/sql on a live cluster: each request is answered, or refused with a
4xx JSON error that has a code and a message, never a 5xx; and the node is still up and
answering afterwards.

Some of these the SQL engine may come to answer (a CTE, a long OR chain): those accept either
a correct-looking answer or a 4xx. Statements that write, reach files, the network, the
environment or the engine's settings must always be refused.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field

import pytest
import urllib3

from tests.integration.bi_cluster import bi_cluster  # noqa: F401 - a fixture

HTTP = urllib3.PoolManager()
# `make fuzz` adds the slow ones (IN lists of 50,000 integers, keys and parameters)
HUGE = os.environ.get("FEDERATOR_HOSTILE_HUGE") == "1"


@dataclass
class Case:
    name: str
    body: bytes
    refuse: bool = True  # a 4xx is the only right answer; else an answer is fine too
    headers: dict = field(default_factory=dict)
    timeout: float = 60.0
    rows: list | None = None  # the answer's rows, when it is answered
    known: str | None = None  # why today's engine fails it (xfail), until the engine that mends it lands
    status: int | None = None  # the one status it must get, where that is known


def sql_body(sql, **extra) -> bytes:
    return json.dumps({"sql": sql, **extra}).encode()


def case(name: str, sql, refuse: bool = True, rows: list | None = None, known: str | None = None,
         status: int | None = None, **extra) -> Case:
    return Case(name, sql_body(sql, **extra), refuse, rows=rows, known=known, status=status)


def raw(name: str, body: bytes, refuse: bool = True, **kw) -> Case:
    return Case(name, body, refuse, **kw)


def nested(n: int, open_: str = "(", close: str = ")", inner: str = "1") -> str:
    return open_ * n + inner + close * n


BODIES = [
    raw("not json", b"hello"),
    raw("empty body", b""),
    raw("json array", b"[1, 2]"),
    raw("json string", b'"SELECT 1"'),
    raw("json null", b"null"),
    raw("truncated json", b'{"sql": "SELECT 1"'),
    raw("invalid utf-8", b'{"sql": "SELECT \'\xff\xfe\'"}'),
    raw("invalid utf-8 in a key", b'{"sql\xc3": "SELECT 1"}'),
    raw("utf-16 body", '{"sql": "SELECT 1"}'.encode("utf-16"), refuse=False),
    raw("arrays nested 100,000 deep", b"[" * 100_000 + b"]" * 100_000),
    raw("parameters nested 100,000 deep", b'{"sql": "SELECT ?", "parameters": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
    raw("objects nested 50,000 deep", b'{"a":' * 50_000 + b"1" + b"}" * 50_000),
    raw("parameters nested 900 deep", b'{"sql": "SELECT ?", "parameters": [' + b"[" * 900 + b"]" * 900 + b"]}"),
    raw("a 5,000-digit number", b'{"sql": "SELECT ?", "parameters": [1' + b"0" * 5000 + b"]}"),
    raw("NaN parameter", b'{"sql": "SELECT ?", "parameters": [NaN]}', refuse=False),
    raw("Infinity parameter", b'{"sql": "SELECT ?", "parameters": [-Infinity]}', refuse=False),
    raw("body over 16 MiB", sql_body("SELECT 1", parameters=["x" * (17 * 1024 * 1024)]), status=413),
    raw("unpaired surrogate in sql", b'{"sql": "SELECT \'\\ud800\'"}'),
    raw("unpaired low surrogate in sql", b'{"sql": "SELECT \'a\\udc00b\'"}'),
    raw("unpaired surrogate in a parameter", b'{"sql": "SELECT ?", "parameters": ["x\\ud83d"]}'),
    raw("unpaired surrogate in a key parameter", b'{"sql": "SELECT * FROM players WHERE player = ?", "parameters": ["\\udfff"]}'),
    raw("unpaired surrogate in the token", b'{"sql": "SELECT 1", "consistency_token": "\\ud800"}'),
    raw("unpaired surrogate as a field name", b'{"sql": "SELECT 1", "\\ud800": 1}'),
    raw("a surrogate pair is fine", b'{"sql": "SELECT \'\\ud83d\\ude00\' AS e"}', refuse=False),
    raw("Accept nobody serves", sql_body("SELECT 1"), refuse=False, headers={"Accept": "text/html"}),
]

FIELDS = [
    case("sql a number", 1),
    case("sql null", None),
    case("sql a list", ["SELECT 1"]),
    case("sql an object", {"q": "SELECT 1"}),
    case("sql empty", ""),
    case("sql blank", "   \n\t "),
    case("sql true", True),
    case("unknown field", "SELECT 1", paramters=[1]),
    case("many unknown fields", "SELECT 1", **{f"f{i}": i for i in range(1000)}),
    case("parameters a string", "SELECT ?", parameters="1"),
    case("parameters an object", "SELECT ?", parameters={"1": 1}),
    case("parameters a number", "SELECT ?", parameters=5),
    case("a list parameter", "SELECT ?", parameters=[[1, 2]]),
    case("an object parameter", "SELECT ?", parameters=[{"a": 1}]),
    case("too many parameters", "SELECT ?", parameters=[1, 2]),
    case("too few parameters", "SELECT ?, ?", parameters=[1]),
    case("a parameter outside int64", "SELECT ?", refuse=False, parameters=[2**64]),
    case("token a number", "SELECT 1", consistency_token=5),
    case("token a list", "SELECT 1", consistency_token=["a"]),
    case("token garbage", "SELECT COUNT(*) FROM players", consistency_token="garbage!!"),
    case("token empty", "SELECT COUNT(*) FROM players", refuse=False, consistency_token=""),
    case("token base64 of non-json", "SELECT COUNT(*) FROM players", consistency_token="aGVsbG8"),
    case("token base64 of a list", "SELECT COUNT(*) FROM players", consistency_token="WzEsMl0"),
    case("token of a wrong shape", "SELECT COUNT(*) FROM players", consistency_token="eyJ0Ijp7IjAiOiJ4In19"),
    case("token with a negative offset", "SELECT COUNT(*) FROM players", refuse=False,
         consistency_token="eyJ0Ijp7IjAiOi0xfX0"),
    case("token of 1 MiB", "SELECT COUNT(*) FROM players", consistency_token="A" * (1024 * 1024)),
    case("allow_stale a string", "SELECT 1", allow_stale="yes"),
    case("allow_stale a number", "SELECT 1", allow_stale=1),
    case("max_lag negative", "SELECT 1", max_lag=-1),
    case("max_lag a fraction", "SELECT 1", max_lag=1.5),
    case("max_lag a string", "SELECT 1", max_lag="5"),
    case("max_lag 10^30", "SELECT COUNT(*) FROM players", max_lag=10**30),
    case("timeout_ms 0", "SELECT 1", timeout_ms=0),
    case("timeout_ms negative", "SELECT 1", timeout_ms=-5),
    case("timeout_ms 1e15", "SELECT COUNT(*) FROM players", timeout_ms=1e15),
    # more than the node's --max-timeout-ms runs with that maximum (TestLimits checks the stats)
    case("timeout_ms 10^15", "SELECT COUNT(*) FROM players", refuse=False, rows=[[60]], timeout_ms=10**15),
    case("timeout_ms 10^30", "SELECT games FROM players WHERE player = 'p001'", refuse=False, rows=[[3]],
         timeout_ms=10**30),
    case("timeout_ms a string", "SELECT 1", timeout_ms="10"),
    case("timeout_ms true", "SELECT 1", timeout_ms=True),
    case("format unknown", "SELECT 1", format="xml"),
    case("format a number", "SELECT 1", format=5),
    case("format a list", "SELECT 1", format=["json"]),
    case("dialect a number", "SELECT 1", dialect=5),
    case("dialect unknown", "SELECT 1", dialect="klingon"),
    case("dialect with a surrogate", "SELECT 1", dialect="\ud800"),
    case("a postgres dialect", "SELECT 1::int AS one", refuse=False, rows=[[1]], dialect="postgres"),
]

SQL = [
    case("NUL in the SQL", "SELECT 1\x00"),
    case("NUL inside a string literal", "SELECT 'a\x00b'"),
    case("NUL in a string parameter", "SELECT * FROM players WHERE player = ?", refuse=False, parameters=["p\x00"]),
    case("SQL over 1 MiB", "SELECT 1" + " " * (1024 * 1024), status=400),
    case("a string literal of 500,000 characters", "SELECT '" + "x" * 500_000 + "' AS s", refuse=False),
    case("an identifier of 100,000 characters", 'SELECT "' + "c" * 100_000 + '" FROM players'),
    case("3,000 output columns", "SELECT " + ", ".join("1" for _ in range(3000)), refuse=False),
    case("50 nested parentheses", "SELECT " + nested(50), refuse=False),
    case("100,000 nested parentheses", "SELECT " + nested(100_000)),
    case("500,000 opening parentheses", "SELECT " + "(" * 500_000),
    case("50 nested brackets", "SELECT " + nested(50, "[", "]"), refuse=False),
    case("50 nested function calls", "SELECT " + nested(50, "abs(", inner="games") + " FROM players", refuse=False),
    # the deepest the input guard lets through must still plan and run
    case("32 nested function calls", "SELECT COUNT(" + nested(31, "abs(", inner="games") + ") FROM players", refuse=False,
         rows=[[51]]),
    case("32 nested CASEs", "SELECT " + "CASE WHEN games > 0 THEN " * 32 + "1" + " END" * 32 + " AS c FROM players"
         " WHERE player = 'p001'", refuse=False, rows=[[1]]),
    case("50 nested CASEs", "SELECT " + "CASE WHEN TRUE THEN " * 50 + "1" + " END" * 50, refuse=False),
    case("50 nested subqueries", "SELECT * FROM " + "(SELECT * FROM " * 50 + "players" + ")" * 50, refuse=False),
    case("200 NOTs", "SELECT " + "NOT " * 200 + "TRUE", refuse=False),
    case("1,000 unary minuses", "SELECT " + "- " * 1000 + "1", refuse=False),
    case("an OR of 350 terms", "SELECT player FROM players WHERE " + " OR ".join(f"games = {i}" for i in range(350)),
         refuse=False),
    case("an AND of 500 terms", "SELECT COUNT(*) FROM players WHERE " + " AND ".join(f"games <> {i}" for i in range(500)),
         refuse=False),
    case("1+1+... of 400 terms", "SELECT " + "+".join(["1"] * 400), refuse=False),
    case("a sum of 400 columns", "SELECT " + " + ".join(["games"] * 400) + " FROM players", refuse=False),
    case("a string concatenation of 1,000 terms", "SELECT " + " || ".join(["'a'"] * 1000), refuse=False),
    case("LIMIT 9223372036854775808", "SELECT * FROM players LIMIT 9223372036854775808"),
    case("LIMIT 9223372036854775808 without FROM", "SELECT 1 LIMIT 9223372036854775808"),
    case("OFFSET 9223372036854775808", "SELECT * FROM players LIMIT 1 OFFSET 9223372036854775808", refuse=False),
    case("LIMIT -1", "SELECT * FROM players LIMIT -1"),
    case("LIMIT 1e30", "SELECT * FROM players LIMIT 1e30"),
    case("LIMIT ? of 2^63", "SELECT * FROM players LIMIT ?", parameters=[2**63]),
    case("LIMIT 9223372036854775807", "SELECT COUNT(*) FROM players LIMIT 9223372036854775807", refuse=False),
    case("integer literal beyond int64", "SELECT 99999999999999999999999999999999999999999", refuse=False),
    case("overflow in arithmetic", "SELECT 9223372036854775807 + 1"),
    case("division by zero", "SELECT games // 0 FROM players", refuse=False),
    case("$0", "SELECT $0", parameters=[1]),
    case("$99999999999", "SELECT $99999999999", parameters=[1]),
    case("$2 with one parameter", "SELECT $1, $2", parameters=[1]),
    case("$2 without $1", "SELECT $2", parameters=[1, 2]),
    case("a named $placeholder", "SELECT $name", parameters=[1]),
    case("? mixed with $1", "SELECT ?, $1", parameters=[1, 2]),
    case("garbage", "SELEC 1"),
    case("an unterminated string", "SELECT 'abc"),
    case("an unterminated identifier", 'SELECT "abc'),
    case("an unterminated comment", "SELECT 1 /* never closed"),
    case("only a comment", "-- nothing here"),
    case("only semicolons", ";;;"),
    case("two statements", "SELECT 1; SELECT 2"),
    case("a read then a write", "SELECT 1; DROP TABLE players"),
    case("an unknown store", "SELECT * FROM nowhere"),
    case("an unknown column", "SELECT nothing FROM players"),
    case("an unknown function", "SELECT no_such_function(1)"),
    case("a CTE", "WITH t AS (SELECT player FROM players) SELECT COUNT(*) FROM t", refuse=False),
    case("a recursive CTE", "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT n FROM r LIMIT 5",
         refuse=False),
    case("COUNT(DISTINCT NULL) by group", "SELECT team, COUNT(DISTINCT NULL) FROM players GROUP BY team", refuse=False),
    case("WHERE NULL", "SELECT player FROM players WHERE NULL", refuse=False, rows=[]),
]

# Anything that writes, changes settings, or reaches files, the network, extensions or the
# environment: always refused, whatever the engine.
NOT_READS = [
    "CREATE TABLE t (a INTEGER)",
    "CREATE VIEW v AS SELECT 1",
    "CREATE MACRO m(a) AS a + 1",
    "CREATE SECRET s (TYPE S3, KEY_ID 'k', SECRET 's')",
    "INSERT INTO players VALUES ('x', 'red', 1, 1.0, TRUE, NULL)",
    "UPDATE players SET games = 0",
    "DELETE FROM players",
    "DROP TABLE players",
    "ALTER TABLE players ADD COLUMN x INTEGER",
    "TRUNCATE players",
    "COPY players TO '/tmp/federator-hostile.csv'",
    "COPY (SELECT 1) TO '/tmp/federator-hostile.parquet' (FORMAT parquet)",
    "ATTACH '/tmp/federator-hostile.db' AS x",
    "DETACH x",
    "INSTALL httpfs",
    "LOAD httpfs",
    "FORCE INSTALL httpfs",
    "PRAGMA version",
    "PRAGMA enable_profiling",
    "SET threads = 1",
    "SET enable_external_access = true",
    "RESET threads",
    "CALL pragma_version()",
    "EXPORT DATABASE '/tmp/federator-hostile'",
    "IMPORT DATABASE '/tmp/federator-hostile'",
    "CHECKPOINT",
    "VACUUM",
    "BEGIN TRANSACTION",
    "COMMIT",
    "USE memory",
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM read_csv_auto('/etc/hostname')",
    "SELECT * FROM read_parquet('/tmp/x.parquet')",
    "SELECT * FROM read_json('/etc/hosts')",
    "SELECT * FROM '/etc/passwd'",
    "SELECT * FROM read_text('/etc/passwd')",
    "SELECT * FROM glob('/*')",
    "SELECT getenv('HOME')",
    "SELECT * FROM read_csv('http://127.0.0.1:9/x.csv')",
]

# The server's own settings (DuckDB's include the paths of its spill and home directories)
SETTINGS = ["SELECT current_setting('temp_directory')", "SELECT * FROM duckdb_settings()",
            "SELECT * FROM pragma_database_list()", "SELECT * FROM duckdb_temporary_files()"]

CASES = (BODIES + FIELDS + SQL + [case(f"not a read: {s}", s) for s in NOT_READS]
         + [case(f"settings: {s}", s) for s in SETTINGS])

# How long these take is printed (pytest -s shows it). The players are p000 to p059: the keys
# p000, p001, ... find all 60; games are multiples of 3 or NULL (51 are not). `make fuzz` adds
# the slower ones.
KEYS = [f"p{i:03d}" for i in range(50_000)]


def key_in(n: int) -> Case:
    return case(f"IN of {n:,} keys", f"SELECT COUNT(*) FROM players WHERE player IN ({', '.join(map(repr, KEYS[:n]))})",
                refuse=False, rows=[[60]], timeout_ms=600_000)


def key_parameters_in(n: int) -> Case:
    return case(f"IN of {n:,} key parameters", f"SELECT COUNT(*) FROM players WHERE player IN ({', '.join('?' * n)})",
                refuse=False, rows=[[60]], timeout_ms=600_000, parameters=KEYS[:n])


def integers_in(n: int) -> Case:
    return case(f"IN of {n:,} integers", f"SELECT COUNT(*) FROM players WHERE games IN ({', '.join(map(str, range(n)))})",
                refuse=False, rows=[[51]], timeout_ms=600_000)


# the default run keeps one of each shape at a size that costs a second or two; 50,000 (about
# 20 s each) is `make fuzz`'s
HUGE_IN = [integers_in(5_000), key_parameters_in(1000)]
if HUGE:
    HUGE_IN += [integers_in(50_000), key_in(50_000), key_parameters_in(50_000)]
for big in HUGE_IN:
    big.timeout = 900.0


def post(node, c: Case) -> urllib3.BaseHTTPResponse:
    headers = {"Content-Type": "application/json", **c.headers}
    return HTTP.request("POST", f"http://{node.endpoint}/v1/sql", body=c.body, headers=headers,
                        timeout=c.timeout, retries=False)


def assert_answered_or_refused(resp: urllib3.BaseHTTPResponse, c: Case) -> None:
    shown = resp.data[:400]
    assert resp.status < 500, f"{c.name}: {resp.status} {shown!r}"
    assert c.status in (None, resp.status), f"{c.name}: expected {c.status}, got {resp.status} {shown!r}"
    if c.refuse:
        assert 400 <= resp.status < 500, f"{c.name}: expected a 4xx, got {resp.status} {shown!r}"
    if resp.status >= 400:
        assert resp.headers.get("Content-Type", "").startswith("application/json"), f"{c.name}: {resp.headers}"
        err = json.loads(resp.data)["error"]
        assert isinstance(err.get("code"), str) and err["code"], f"{c.name}: {err}"
        assert isinstance(err.get("message"), str) and len(err["message"]) > 10, f"{c.name}: {err}"
    elif c.rows is not None:
        assert json.loads(resp.data)["rows"] == c.rows, f"{c.name}: {resp.data[:300]!r}"


def assert_healthy(node) -> None:
    assert node.proc is not None and node.proc.poll() is None, f"{node.node_id} died"
    resp = HTTP.request("POST", f"http://{node.endpoint}/v1/sql", body=sql_body("SELECT COUNT(*) FROM players"),
                        headers={"Content-Type": "application/json"}, timeout=60, retries=False)
    assert resp.status == 200 and json.loads(resp.data)["rows"] == [[60]], resp.data[:300]


def params(cases: list[Case]) -> list:
    return [pytest.param(c, id=c.name, marks=[pytest.mark.xfail(reason=c.known, strict=False)] if c.known else [])
            for c in cases]


@pytest.mark.parametrize("c", params(CASES))
def test_hostile_request_is_refused_or_answered_and_the_node_lives(bi_cluster, c: Case) -> None:  # noqa: F811
    node = bi_cluster.nodes[CASES.index(c) % len(bi_cluster.nodes)]
    assert_answered_or_refused(post(node, c), c)
    assert_healthy(node)


@pytest.mark.parametrize("c", params(HUGE_IN))
def test_huge_in_lists_are_answered_or_refused(bi_cluster, c: Case) -> None:  # noqa: F811
    node = bi_cluster.nodes[0]
    started = time.monotonic()
    resp = post(node, c)
    print(f"\n{c.name}: {resp.status} in {time.monotonic() - started:.1f} s")
    assert_answered_or_refused(resp, c)
    assert_healthy(node)


def test_every_node_is_still_up(bi_cluster) -> None:  # noqa: F811
    for node in bi_cluster.nodes:
        assert_healthy(node)


# --- limits and admission ---------------------------------------------------------------------
# Two nodes of their own application, started with small limits (the bi_cluster above has the
# defaults), shared by the tests below; they run after the bi_cluster has stopped.

LIMITED_P = 4
LIMITED_ROWS = 200
LIMITS = {"--max-body-bytes": "64KiB", "--max-sql-chars": "4096", "--max-answer-rows": "100",
          "--max-answer-bytes": "100KB", "--max-timeout-ms": "30000",
          "--max-running-queries": "1", "--max-queued-queries": "0"}


@dataclass
class Limited:
    cluster: object
    defn: object
    written: object  # the Position of the rows written so far
    rows: int  # how many rows the store holds

    @property
    def nodes(self):
        return self.cluster.nodes  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def limited(broker, tmp_path_factory):
    import uuid

    from tests.integration.changelog_util import register
    from tests.integration.cluster import Cluster, write_with_token
    from tests.conftest import free_port

    app_id = f"lim{uuid.uuid4().hex[:8]}"
    defn = register(broker, app_id, {"name": "events", "type": "kv", "partitions": LIMITED_P,
                                     "key": {"name": "id", "format": "string"},
                                     "value": {"name": "n", "format": "long"}})
    written = write_with_token(broker.bootstrap_servers, defn, {f"e{i:04d}": i for i in range(LIMITED_ROWS)})
    cluster = Cluster(broker.bootstrap_servers, app_id, tmp_path_factory.mktemp("limited"), size=2, standby_replicas=0)
    for node in cluster.nodes:
        node.extra_args = [arg for flag_value in LIMITS.items() for arg in flag_value]
    cluster.nodes[1].flight_port = free_port()
    try:
        cluster.start()
        cluster.wait_settled("events", LIMITED_P, timeout=60)
        yield Limited(cluster, defn, written, LIMITED_ROWS)
    finally:
        cluster.stop()


def post_json(node, body: dict, timeout: float = 60.0, **headers) -> urllib3.BaseHTTPResponse:
    return HTTP.request("POST", f"http://{node.endpoint}/v1/sql", body=json.dumps(body).encode(),
                        headers={"Content-Type": "application/json", **headers}, timeout=timeout, retries=False)


def error_of(resp: urllib3.BaseHTTPResponse, status: int, code: str, *words: str) -> str:
    """The message of a JSON error answer with this status and code, holding ``words``."""
    assert resp.status == status, (resp.status, resp.data[:400])
    assert resp.headers.get("Content-Type", "").startswith("application/json"), resp.headers
    err = json.loads(resp.data)["error"]
    assert err["code"] == code, err
    for w in words:
        assert w in err["message"], err["message"]
    return err["message"]


def assert_limited_healthy(limited: Limited) -> None:
    for node in limited.nodes:
        assert node.proc is not None and node.proc.poll() is None, f"{node.node_id} died"
        resp = post_json(node, {"sql": "SELECT COUNT(*) FROM events"})
        assert resp.status == 200 and json.loads(resp.data)["rows"] == [[limited.rows]], resp.data[:300]
        assert node.metadata()["local"]["queries"]["running"] == 0


def test_a_body_over_the_cap_is_413(limited) -> None:
    big = {"sql": "SELECT ?", "parameters": ["x" * (70 * 1024)]}
    error_of(post_json(limited.nodes[0], big), 413, "REQUEST_TOO_LARGE", "65,536 bytes (64 KiB)", "--max-body-bytes")
    assert_limited_healthy(limited)


def test_sql_over_the_cap_is_400(limited) -> None:
    sql = "SELECT COUNT(*) FROM events WHERE id IN (" + ", ".join(f"'e{i:04d}'" for i in range(500)) + ")"
    error_of(post_json(limited.nodes[1], {"sql": sql}), 400, "SQL_TOO_LONG", "--max-sql-chars", "parameters")
    # as the message says: the same list as parameters fits
    params = {"sql": f"SELECT COUNT(*) FROM events WHERE id IN ({', '.join('?' * 500)})",
              "parameters": [f"e{i:04d}" for i in range(500)]}
    resp = post_json(limited.nodes[1], params)
    assert resp.status == 200 and json.loads(resp.data)["rows"] == [[limited.rows]], resp.data[:300]
    assert_limited_healthy(limited)


@pytest.mark.parametrize("fmt", ["json", "arrow"])
def test_an_answer_over_the_row_cap_is_422_and_paging_works(limited, fmt: str) -> None:
    node = limited.nodes[0]
    error_of(post_json(node, {"sql": "SELECT * FROM events", "format": fmt}), 422, "ANSWER_TOO_LARGE",
             "more than 100 rows", "--max-answer-rows", "LIMIT", "OFFSET", "WHERE")
    seen = []
    for offset in (0, 100):  # what the message says to do
        resp = post_json(node, {"sql": f"SELECT id FROM events ORDER BY id LIMIT 100 OFFSET {offset}"})
        assert resp.status == 200, resp.data[:300]
        seen += [r[0] for r in json.loads(resp.data)["rows"]]
    assert seen == [f"e{i:04d}" for i in range(LIMITED_ROWS)]
    assert_limited_healthy(limited)


def test_an_answer_over_the_byte_cap_is_422(limited) -> None:
    error_of(post_json(limited.nodes[1], {"sql": "SELECT repeat('x', 200000) AS s"}), 422, "ANSWER_TOO_LARGE",
             "100,000 bytes as Arrow", "--max-answer-bytes")
    assert_limited_healthy(limited)


def test_a_timeout_over_the_maximum_runs_with_it_and_says_so(limited) -> None:
    resp = post_json(limited.nodes[0], {"sql": "SELECT COUNT(*) FROM events", "timeout_ms": 3_600_000})
    assert resp.status == 200, resp.data[:300]
    stats = json.loads(resp.data)["stats"]
    assert stats["timeout_ms"] == 30_000 and stats["timeout_ms_requested"] == 3_600_000, stats
    assert_limited_healthy(limited)


def test_the_flight_sql_answer_cap(limited) -> None:
    import pyarrow as pa
    import pyarrow.flight as flight

    from federator.flight import protocol

    client = flight.connect(f"grpc://127.0.0.1:{limited.nodes[1].flight_port}")
    descriptor = flight.FlightDescriptor.for_command(protocol.pack(protocol.CommandStatementQuery(
        query="SELECT * FROM events")))
    with pytest.raises(pa.ArrowInvalid, match="ANSWER_TOO_LARGE.*--max-answer-rows"):
        client.get_flight_info(descriptor)
    client.close()
    assert_limited_healthy(limited)


def test_over_concurrency_is_429_and_node_to_node_calls_still_run(limited) -> None:
    """Node 1 runs one query at a time and queues none. A query that waits for a write only the
    test makes (a consistency token one record ahead of partition 0) holds its slot for as long
    as the test likes: then node 1 refuses HTTP and Flight SQL queries with 429 (UNAVAILABLE in
    gRPC), while a query at node 0 still reads node 1's partitions through the internal API."""
    import pyarrow.flight as flight

    from federator.flight import protocol
    from federator.partitioner import partition_for
    from federator.query.position import Position
    from tests.integration.cluster import wait_for, write_with_token
    from tests.threads import Worker

    n0, n1 = limited.nodes
    topic = limited.defn.topic
    ahead = Position({topic: {0: limited.written.partitions(topic)[0] + 1}})  # the next record of partition 0
    held: dict = {}

    def hold() -> None:
        held["resp"] = post_json(n1, {"sql": "SELECT COUNT(*) FROM events", "consistency_token": ahead.to_token(),
                                      "timeout_ms": 30_000})

    holder = Worker(hold, name="slot holder")
    holder.start()
    try:
        wait_for(lambda: n1.metadata()["local"]["queries"]["running"] == 1, 30, "the held query to take node 1's slot")
        resp = post_json(n1, {"sql": "SELECT 1"})
        error_of(resp, 429, "TOO_MANY_QUERIES", "--max-running-queries", "--max-queued-queries", "Retry-After")
        assert resp.headers.get("Retry-After") == "1", resp.headers
        client = flight.connect(f"grpc://127.0.0.1:{n1.flight_port}")
        descriptor = flight.FlightDescriptor.for_command(protocol.pack(protocol.CommandStatementQuery(query="SELECT 1")))
        with pytest.raises(flight.FlightUnavailableError, match="TOO_MANY_QUERIES"):
            client.get_flight_info(descriptor)
        client.close()
        # node 0 reads every partition, node 1's through its internal API, which admission leaves alone
        owners = set(limited.cluster.active_map("events").values())  # type: ignore[attr-defined]
        assert owners == {"n0", "n1"}, owners
        resp = post_json(n0, {"sql": "SELECT COUNT(*) FROM events"})
        assert resp.status == 200 and json.loads(resp.data)["rows"] == [[limited.rows]], resp.data[:300]
    finally:
        # the write the held query waits for: it answers, and frees the slot
        key = next(f"x{i}" for i in range(1000)
                   if partition_for(limited.defn.key.serialize(f"x{i}"), LIMITED_P) == 0)
        limited.written = limited.written.merge(write_with_token(n0.bootstrap, limited.defn, {key: 1}))
        limited.rows += 1
        holder.join_checked(60)
    assert held["resp"].status == 200 and json.loads(held["resp"].data)["rows"] == [[limited.rows]], held["resp"].data
    assert_limited_healthy(limited)
