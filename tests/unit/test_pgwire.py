"""The Postgres protocol's parts with small fakes: statement splitting, value encodings, the
session's statements, and a server on a real socket in front of a fake SQL service."""

from __future__ import annotations

import datetime as dt
import decimal
import socket
import struct

import pyarrow as pa
import pytest
from hypothesis import given, strategies as st

from federator.catalog.definition import StoreDefinition
from federator.errors import SqlError
from federator.pgwire import types as pgt
from federator.pgwire.catalog import PgCatalog
from federator.pgwire.server import PgServer, split_statements
from federator.pgwire.session import Session
from federator.plugin.loader import load_plugins
from federator.query.position import Position
from federator.sql.result import SqlRequest, SqlResult


def test_statements_split_on_semicolons_outside_strings_names_and_comments() -> None:
    sql = """SELECT 'a;b', "c;d" FROM t; -- one; two
    SELECT $$x;y$$, $tag$;$tag$ /* ; */ ;;  SELECT 3;"""
    assert split_statements(sql) == [
        "SELECT 'a;b', \"c;d\" FROM t", "-- one; two\n    SELECT $$x;y$$, $tag$;$tag$ /* ; */", "SELECT 3"]
    assert split_statements("  ;  -- nothing\n") == []
    assert split_statements("SELECT 'it''s; fine'") == ["SELECT 'it''s; fine'"]


@pytest.mark.parametrize("oid,value,text,binary", [
    (pgt.BOOL, True, "t", b"\x01"),
    (pgt.INT2, -2, "-2", struct.pack("!h", -2)),
    (pgt.INT4, 7, "7", struct.pack("!i", 7)),
    (pgt.INT8, 2**40, str(2**40), struct.pack("!q", 2**40)),
    (pgt.FLOAT8, float("inf"), "Infinity", struct.pack("!d", float("inf"))),
    (pgt.FLOAT8, 0.1, "0.1", struct.pack("!d", 0.1)),
    (pgt.VARCHAR, "Ünï", "Ünï", "Ünï".encode()),
    (pgt.BYTEA, b"\x00\xff", "\\x00ff", b"\x00\xff"),
    (pgt.DATE, dt.date(2000, 1, 3), "2000-01-03", struct.pack("!i", 2)),
    (pgt.TIMESTAMP, dt.datetime(2000, 1, 1, 0, 0, 1), "2000-01-01 00:00:01", struct.pack("!q", 1_000_000)),
    (pgt.TIMESTAMPTZ, dt.datetime(2000, 1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=1))),
     "2000-01-01 00:00:00+00", struct.pack("!q", 0)),
    (pgt.NUMERIC, decimal.Decimal("-12345.678"), "-12345.678",
     struct.pack("!hhHH3H", 3, 1, 0x4000, 3, 1, 2345, 6780)),
])
def test_each_type_is_written_as_postgres_writes_it(oid, value, text, binary) -> None:
    (as_text,) = pgt.row_encoders([oid], [0])
    (as_binary,) = pgt.row_encoders([oid], [1])
    assert as_text(value) == text.encode()
    assert as_binary(value) == binary
    # and a parameter sent in either form reads back as the value
    expected = value.astimezone(dt.timezone.utc) if isinstance(value, dt.datetime) and value.tzinfo else value
    assert pgt.decode_parameter(binary, oid, 1) == expected
    if oid not in (pgt.TIMESTAMPTZ, pgt.FLOAT8):
        assert pgt.decode_parameter(text.encode(), oid, 0) == value


@given(st.decimals(allow_nan=False, allow_infinity=False, places=None).filter(lambda d: abs(d.adjusted()) < 60))
def test_numeric_binary_round_trips(value: decimal.Decimal) -> None:
    (as_binary,) = pgt.row_encoders([pgt.NUMERIC], [1])
    back = pgt.decode_parameter(as_binary(value), pgt.NUMERIC, 1)
    assert back == value


def test_a_parameter_that_does_not_read_says_which_type() -> None:
    with pytest.raises(ValueError, match="is not a int8"):
        pgt.decode_parameter(b"twelve", pgt.INT8, 0)
    with pytest.raises(ValueError, match="binary value of type int4"):
        pgt.decode_parameter(b"\x01", pgt.INT4, 1)
    assert pgt.decode_parameter(b"anything", 0, 0) == "anything"  # an unspecified type stays text


def test_arrow_types_are_described_by_their_postgres_twins() -> None:
    assert [pgt.oid_of(t) for t in (pa.int64(), pa.int32(), pa.float64(), pa.string(), pa.binary(), pa.bool_(),
                                    pa.timestamp("ms", tz="UTC"), pa.timestamp("us"), pa.date32(),
                                    pa.decimal128(10, 2), pa.list_(pa.int64()), pa.list_(pa.string()),
                                    pa.list_(pa.list_(pa.int64())), pa.struct([("a", pa.int64())]))] == \
           [pgt.INT8, pgt.INT4, pgt.FLOAT8, pgt.VARCHAR, pgt.BYTEA, pgt.BOOL, pgt.TIMESTAMPTZ, pgt.TIMESTAMP,
            pgt.DATE, pgt.NUMERIC, 1016, 1015, pgt.TEXT, pgt.TEXT]  # int8[], varchar[]; nested: text


def test_a_list_is_written_as_a_postgres_array() -> None:
    (text,) = pgt.row_encoders([pgt.ARRAYS[pgt.VARCHAR]], [0])
    assert text(["player", None, "a b", 'say "hi"', "", "null", "x,y"]) == \
        b'{player,NULL,"a b","say \\"hi\\"","","null","x,y"}'
    (binary,) = pgt.row_encoders([pgt.ARRAYS[pgt.INT4]], [1])
    assert binary([7, None]) == struct.pack("!iiIii", 1, 1, pgt.INT4, 2, 1) + struct.pack("!ii", 4, 7) + \
        struct.pack("!i", -1)
    assert binary([]) == struct.pack("!iiI", 0, 0, pgt.INT4)


@pytest.mark.parametrize("oid,values", [
    (pgt.ARRAYS[pgt.VARCHAR], ["r", None, "a b", 'say "hi"', "", "null", "x,y", "back\\slash"]),
    (pgt.ARRAYS[pgt.INT8], [1, None, -3]),
    (pgt.ARRAYS[pgt.TEXT], []),
])
def test_an_array_parameter_reads_back_as_a_list(oid, values) -> None:
    for fmt in (0, 1):
        (encode,) = pgt.row_encoders([oid], [fmt])
        assert pgt.decode_parameter(encode(values), oid, fmt) == values
    assert pgt.decode_parameter(b"{r, p ,f}", pgt.ARRAYS[pgt.VARCHAR], 0) == ["r", "p", "f"]
    assert pgt.decode_parameter(b"[1:2]={1,2}", pgt.ARRAYS[pgt.INT4], 0) == [1, 2]


@pytest.mark.parametrize("text,why", [(b"r,p", "is not an array"), (b"{{1},{2}}", "only one-dimensional"),
                                      (b'{"r}', "unterminated quote"), (b'{"r"p}', "text after a quoted element")])
def test_an_array_parameter_that_does_not_read_says_why(text, why) -> None:
    with pytest.raises(ValueError, match=why):
        pgt.decode_parameter(text, pgt.ARRAYS[pgt.VARCHAR], 0)


# ---- a session over a fake SQL service ----------------------------------------------------------

class FakeService:
    """What the session asks of the node's SqlService: its stores, and running a statement."""

    def __init__(self) -> None:
        registry = load_plugins()
        self.stores = {"players": StoreDefinition.from_dict({
            "name": "players", "type": "kv", "partitions": 2, "topic": "t-players",
            "key": {"name": "player", "format": "string"},
            "value": {"format": "json", "fields": [{"name": "games", "type": "long"}]}}, registry)}
        self.requests: list[SqlRequest] = []

    def sql(self, req: SqlRequest) -> SqlResult:
        self.requests.append(req)
        if "boom" in req.sql:
            raise SqlError("UNKNOWN_COLUMN", "no column boom")
        table = pa.table({"player": ["a", "b", "c", "d", "e"], "games": [1, 2, 3, 4, 5]})
        token = Position({"t-players": {0: len(self.requests)}}).to_token()  # the n-th request's answer is at n
        return SqlResult(table.schema, iter(table.to_batches(max_chunksize=2)), token, {})


@pytest.fixture
def session() -> Session:
    service = FakeService()
    return Session(service, PgCatalog(lambda: service.stores), "alice", 7)


def rows(answer) -> list[tuple]:
    table = pa.Table.from_batches(list(answer.batches), schema=answer.schema)
    return [tuple(r.values()) for r in table.to_pylist()]


def test_settings_are_the_consistency_options_of_the_next_query(session) -> None:
    for sql in ("SET federator.consistency_token = 'tok'", "SET federator.allow_stale TO on",
                "set federator.max_lag = 5", "SET statement_timeout = '250ms'"):
        assert session.execute(sql).tag == "SET"
    session.execute("SELECT * FROM players")
    req = session.service.requests[-1]
    assert (req.consistency_token, req.allow_stale, req.max_lag, req.timeout_ms, req.dialect) == \
           ("tok", True, 5, 250, "postgres")
    # the answer's token
    assert rows(session.execute("SHOW federator.consistency_token")) == [(Position({"t-players": {0: 1}}).to_token(),)]
    assert session.execute("RESET federator.allow_stale").tag == "RESET"
    assert rows(session.execute("SHOW federator.allow_stale")) == [("off",)]
    with pytest.raises(SqlError, match="max_lag must be a whole number"):
        session.execute("SET federator.max_lag = soon")
    with pytest.raises(SqlError, match="unrecognized configuration parameter"):
        session.execute("SHOW no_such_thing")


def test_startup_parameters_and_pgoptions_are_settings() -> None:
    service = FakeService()
    s = Session(service, PgCatalog(lambda: service.stores), "alice", 7,
                {"application_name": "psql", "options": "-c federator.allow_stale=on -c statement_timeout=900"})
    assert (s.settings["application_name"], s.settings["federator.allow_stale"], s.settings["statement_timeout"]) == \
           ("psql", "on", "900")


def test_a_failed_statement_in_a_transaction_blocks_until_rollback(session) -> None:
    assert session.execute("BEGIN READ ONLY").tag == "BEGIN" and session.status == "T"
    with pytest.raises(SqlError):
        session.execute("SELECT boom FROM players")
    session.fail()
    assert session.status == "E"
    with pytest.raises(SqlError, match="transaction is aborted"):
        session.execute("SELECT * FROM players")
    assert session.execute("ROLLBACK").tag == "ROLLBACK" and session.status == "I"
    assert len(rows(session.execute("SELECT * FROM players"))) == 5


def test_cursors_fetch_in_pieces_across_batches(session) -> None:
    assert session.execute('DECLARE "c1" NO SCROLL CURSOR WITHOUT HOLD FOR SELECT * FROM players').tag == \
           "DECLARE CURSOR"
    assert rows(session.execute('FETCH FORWARD 3 FROM "c1"')) == [("a", 1), ("b", 2), ("c", 3)]
    assert session.execute("MOVE 1 IN c1").tag == "MOVE 1"
    assert rows(session.execute("FETCH ALL FROM c1")) == [("e", 5)]
    assert rows(session.execute("FETCH NEXT FROM c1")) == []
    assert session.execute("CLOSE c1").tag == "CLOSE CURSOR"
    with pytest.raises(SqlError, match="does not exist"):
        session.execute("FETCH 1 FROM c1")


def test_catalog_queries_never_reach_the_engine(session) -> None:
    assert rows(session.execute("SELECT version()"))[0][0].startswith("PostgreSQL 16")
    assert rows(session.execute("SELECT relname FROM pg_catalog.pg_class WHERE relkind = 'r'")) == [("players",)]
    assert rows(session.execute(
        "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'players' "
        "ORDER BY ordinal_position")) == [("player", "character varying"), ("games", "bigint"),
                                           ("rowtime", "timestamp with time zone")]  # Postgres's names
    assert session.service.requests == []
    assert session.describe("SELECT player FROM players WHERE games > $1 LIMIT $2") == \
           ([pgt.INT8, pgt.INT8], pa.schema([pa.field("player", pa.string())]))


def test_what_pgcli_asks_on_connect_and_for_completion(session) -> None:
    assert rows(session.execute("SHOW TIME ZONE")) == [("UTC",)]
    assert session.execute("SHOW TIME ZONE").schema.names == ["TimeZone"]
    assert rows(session.execute("SELECT * FROM unnest(current_schemas(true))")) == [("pg_catalog",), ("public",)]
    assert rows(session.execute("SELECT current_schemas(false)")) == [(["public"],)]
    relations = "SELECT c.relname FROM pg_catalog.pg_class c WHERE c.relkind = ANY({}) ORDER BY 1"
    assert session.describe(relations.format("$1"))[0] == [pgt.ARRAYS[pgt.VARCHAR]]  # a list binds as text[]
    assert rows(session.execute(relations.format("$1"), [["r", "p"]])) == [("players",)]
    assert rows(session.execute(relations.format("""'{r,p,""}'"""))) == [("players",)]  # psycopg's sql.Literal
    assert rows(session.execute(relations.format("'{v,m}'::text[]"))) == []  # no views: DuckDB's own are not shown
    functions = rows(session.execute(
        "SELECT n.nspname, p.proname, COALESCE(proallargtypes::regtype[], proargtypes::regtype[])::text[], "
        "prorettype::regtype::text FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace "
        "WHERE p.prorettype::regtype != 'trigger'::regtype AND p.proname IN ('lower', 'range') ORDER BY 2, 3"))
    assert ("pg_catalog", "lower", ["VARCHAR"], "character varying") in functions  # DuckDB's, as they are called
    assert {f[1] for f in functions} == {"lower", "range"}
    assert session.service.requests == []


def test_what_pgjdbc_asks_for_dbeavers_navigator(session) -> None:
    session.execute("SET max_index_keys = 16")
    assert rows(session.execute("SELECT setting FROM pg_catalog.pg_settings WHERE name='max_index_keys'")) == [("16",)]
    types = rows(session.execute(  # getTypeInfo's
        "SELECT t.typname FROM pg_catalog.pg_type t JOIN pg_catalog.pg_namespace n ON (t.typnamespace = n.oid) "
        "WHERE n.nspname != 'pg_toast' AND (t.typrelid = 0 OR (SELECT c.relkind = 'c' FROM pg_catalog.pg_class c "
        "WHERE c.oid = t.typrelid))"))
    assert {("int8",), ("varchar",), ("timestamptz",), ("text",)} <= set(types)
    assert rows(session.execute("SELECT typlen FROM pg_catalog.pg_type WHERE typname IN ('varchar', 'int8') "
                                "ORDER BY typname")) == [(8,), (-1,)]  # Postgres's sizes, not DuckDB's
    assert session.service.requests == []


@pytest.mark.parametrize("name", ["players", "main.players", "public.players", 'PUBLIC."players"',
                                  "federator.main.players", '"federator"."public"."players"'])
@pytest.mark.parametrize("template", ["SELECT * FROM {}", "SELECT {}.player FROM {} ORDER BY 1",
                                      "WITH x AS (SELECT * FROM {}) SELECT * FROM x",
                                      "SELECT * FROM (SELECT player FROM {}) p WHERE EXISTS (SELECT 1 FROM {})"])
def test_a_store_under_any_name_is_read_by_the_engine(session, name, template) -> None:
    sql = template.replace("{}", name)
    assert len(rows(session.execute(sql))) == 5  # the fake engine's rows, not the catalog's empty table
    assert len(session.service.requests) == 1 and session.service.requests[0].sql == sql


@pytest.mark.parametrize("sql", ["SELECT * FROM no_such_store", "SELECT * FROM public.no_such_store",
                                 "SELECT * FROM main.pg_class", "SELECT * FROM otherdb.public.players"])
def test_a_name_that_is_no_store_goes_to_the_engine_which_says_so(session, sql) -> None:
    session.execute(sql)
    assert [r.sql for r in session.service.requests] == [sql]


def test_a_statement_of_stores_and_the_catalog_reads_the_stores_from_the_engine(session) -> None:
    answer = session.execute("SELECT c.relname, p.games FROM pg_catalog.pg_class c "
                             "JOIN main.players p ON c.relname = 'players' WHERE p.games > 2 ORDER BY p.games")
    assert rows(answer) == [("players", 3), ("players", 4), ("players", 5)]
    (req,) = session.service.requests  # the store's every column, as it is named
    assert req.sql == 'SELECT "player", "games", "rowtime" FROM main.players' and req.dialect == "postgres"
    assert rows(session.execute("SHOW federator.consistency_token")) == [(Position({"t-players": {0: 1}}).to_token(),)]


# ---- the server on a real socket ------------------------------------------------------------

def _message(kind: bytes, payload: bytes) -> bytes:
    return kind + struct.pack("!I", len(payload) + 4) + payload


def _read_all(sock: socket.socket) -> bytes:
    out = b""
    while not out.endswith(b"Z\x00\x00\x00\x05I"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        out += chunk
    return out


def test_the_server_answers_queries_and_survives_bad_ones() -> None:
    server = PgServer(FakeService(), "127.0.0.1", 0)
    server.start()
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            params = b"user\x00alice\x00database\x00federator\x00\x00"
            sock.sendall(struct.pack("!II", 8 + len(params), 196608) + params)
            hello = _read_all(sock)
            assert hello.startswith(b"R\x00\x00\x00\x08\x00\x00\x00\x00")  # AuthenticationOk: no users file
            assert b"server_version\x0016.0\x00" in hello
            sock.sendall(_message(b"Q", b"SELECT boom FROM players; SELECT 1\x00"))
            answer = _read_all(sock)
            assert answer.startswith(b"E") and b"C42703\x00" in answer and b"no column boom" in answer
            assert b"D\x00" not in answer  # the statement after the failed one did not run
            sock.sendall(_message(b"Q", b"SELECT * FROM players\x00"))
            answer = _read_all(sock)
            assert answer.count(b"D\x00") == 5 and b"SELECT 5\x00" in answer
            sock.sendall(_message(b"X", b""))
        # a client that sends garbage gets closed; the next one is served
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(b"\x00\x00\x00\x08\x00\x09\x00\x00")
            assert b"speaks the Postgres protocol version 3" in sock.recv(4096)
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            params = b"user\x00bob\x00\x00"
            sock.sendall(struct.pack("!II", 8 + len(params), 196608) + params)
            assert _read_all(sock).endswith(b"Z\x00\x00\x00\x05I")
    finally:
        server.stop()


