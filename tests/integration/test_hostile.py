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
# `make fuzz` adds the slow ones (a 50,000-parameter IN list)
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


def sql_body(sql, **extra) -> bytes:
    return json.dumps({"sql": sql, **extra}).encode()


def case(name: str, sql, refuse: bool = True, rows: list | None = None, known: str | None = None, **extra) -> Case:
    return Case(name, sql_body(sql, **extra), refuse, rows=rows, known=known)


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
    raw("body over 16 MiB", sql_body("SELECT 1", parameters=["x" * (17 * 1024 * 1024)])),
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
    case("timeout_ms 10^15", "SELECT COUNT(*) FROM players", timeout_ms=10**15),
    case("timeout_ms 10^30", "SELECT * FROM players WHERE player = 'p001'", timeout_ms=10**30),
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
    case("SQL over 1 MiB", "SELECT 1" + " " * (1024 * 1024)),
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


HUGE_IN = [
    case("IN of 50,000 integers", f"SELECT COUNT(*) FROM players WHERE games IN ({', '.join(map(str, range(50_000)))})",
         refuse=False, rows=[[51]], timeout_ms=600_000),
    key_parameters_in(1000),
]
if HUGE:
    HUGE_IN += [key_in(50_000), key_parameters_in(50_000)]
for big in HUGE_IN:
    big.timeout = 900.0


def post(node, c: Case) -> urllib3.BaseHTTPResponse:
    headers = {"Content-Type": "application/json", **c.headers}
    return HTTP.request("POST", f"http://{node.endpoint}/v1/sql", body=c.body, headers=headers,
                        timeout=c.timeout, retries=False)


def assert_answered_or_refused(resp: urllib3.BaseHTTPResponse, c: Case) -> None:
    shown = resp.data[:400]
    assert resp.status < 500, f"{c.name}: {resp.status} {shown!r}"
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
