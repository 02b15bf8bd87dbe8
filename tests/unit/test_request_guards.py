"""Bad values in a SQL request are 400s that name what was wrong, before anything recurses:
the SQL text's guard (length, NUL, nesting), placeholder numbering, the body's fields and
decoding, and errors that escape the engine (RecursionError, OverflowError, the rest: 500)."""

from __future__ import annotations

import io
import logging
from typing import Any

import pyarrow as pa
import pytest
from sqlglot import exp

from federator.http.sql_routes import MAX_BODY_BYTES, MAX_TIMEOUT_MS, sql_request_from_body, sql_response
from federator.errors import SqlError
from federator.sql.guard import MAX_SQL_CHARS, MAX_SQL_DEPTH, check_input
from federator.sql.parse import parse
from federator.sql.result import SqlRequest, SqlResult


def refused(fn: Any, *args: Any) -> SqlError:
    with pytest.raises(SqlError) as info:
        fn(*args)
    assert info.value.status == 400, info.value.to_dict()
    return info.value


# --- the SQL text -----------------------------------------------------------------------------


def test_length_limit() -> None:
    check_input("SELECT 1" + " " * (MAX_SQL_CHARS - 8))
    err = refused(check_input, "SELECT 1" + " " * (MAX_SQL_CHARS - 7))
    assert err.code == "SQL_PARSE_ERROR" and "1,048,577 characters" in err.message and "1,048,576" in err.message


def test_nul_is_refused_with_its_place() -> None:
    err = refused(check_input, "SELECT 1,\n  'a\x00b'")
    assert (err.line, err.col) == (2, 5) and "NUL" in err.message


def test_nesting_limit_counts_parentheses_brackets_and_case() -> None:
    check_input("SELECT " + "(" * MAX_SQL_DEPTH + "1" + ")" * MAX_SQL_DEPTH)
    err = refused(check_input, "SELECT " + "(" * (MAX_SQL_DEPTH + 1) + "1" + ")" * (MAX_SQL_DEPTH + 1))
    assert f"nests {MAX_SQL_DEPTH + 1} levels" in err.message and f"at most {MAX_SQL_DEPTH}" in err.message
    assert (err.line, err.col) == (1, 8 + MAX_SQL_DEPTH)
    refused(check_input, "SELECT " + "[" * 20 + "CASE WHEN TRUE THEN " * 13 + "1" + " END" * 13 + "]" * 20)
    # siblings do not add up; closing brings the depth down
    check_input("SELECT " + " + ".join("(" * 20 + "1" + ")" * 20 for _ in range(50)))


def test_nesting_ignores_strings_identifiers_and_comments() -> None:
    deep = "(" * 100
    check_input(f"SELECT '{deep}', 'it''s {deep}', \"{deep}\" -- {deep}\n /* {deep} */ FROM t")
    check_input("SELECT window_end, end_time, \"case\" FROM t")  # words that only contain case/end


def test_a_chain_of_nots_that_the_guard_does_not_count_is_a_400() -> None:
    err = refused(parse, "SELECT " + "NOT " * 300 + "TRUE")
    assert err.code == "SQL_PARSE_ERROR" and "nested too deeply" in err.message


# --- placeholders -----------------------------------------------------------------------------


def indexes(sql: str) -> list[int]:
    stmt = parse(sql)
    return [n.meta["param_index"] for n in stmt.select.find_all(exp.Placeholder)]


def test_numbered_placeholders_take_the_value_they_name() -> None:
    assert parse("SELECT $2, $1").param_count == 2 and sorted(indexes("SELECT $2, $1")) == [0, 1]
    stmt = parse("SELECT $1 AS a, $1 + 1 AS b")
    assert stmt.param_count == 1 and indexes("SELECT $1 AS a, $1 + 1 AS b") == [0, 0]
    assert parse("SELECT ?, ?").param_count == 2


@pytest.mark.parametrize(("sql", "fragment"), [
    ("SELECT $0", "$0 does not exist"),
    ("SELECT $99999999999", "$99999999999 leaves $1 unused"),
    ("SELECT $1, $3", "$3 leaves $2 unused"),
    ("SELECT $name", "$name has a name"),
    ("SELECT ?, $1", "mixes ? and $1"),
])
def test_bad_placeholders_are_named(sql: str, fragment: str) -> None:
    err = refused(parse, sql)
    assert err.code == "INVALID_PARAMETER" and fragment in err.message


# --- the body's fields ------------------------------------------------------------------------


def field_error(body: dict) -> str:
    err = refused(sql_request_from_body, body)
    assert err.code == "INVALID_PARAMETER"
    return err.message


def test_timeout_is_capped_at_the_server_maximum() -> None:
    """More than the node allows runs with its maximum (the answer's stats say so); a value that
    is no whole number of milliseconds is still refused."""
    assert sql_request_from_body({"sql": "SELECT 1", "timeout_ms": MAX_TIMEOUT_MS})[0].timeout_ms == MAX_TIMEOUT_MS
    for more in (MAX_TIMEOUT_MS + 1, 10**15, 10**30):
        assert sql_request_from_body({"sql": "SELECT 1", "timeout_ms": more})[0].timeout_ms == MAX_TIMEOUT_MS
    msg = field_error({"sql": "SELECT 1", "timeout_ms": 1e15})
    assert "'timeout_ms'" in msg and "--max-timeout-ms" in msg and "600000" in msg


def test_max_lag_fits_in_64_bits() -> None:
    assert sql_request_from_body({"sql": "SELECT 1", "max_lag": 2**63 - 1})[0].max_lag == 2**63 - 1
    assert "'max_lag'" in field_error({"sql": "SELECT 1", "max_lag": 2**63})


@pytest.mark.parametrize(("body", "field"), [
    ({"sql": "SELECT '\ud800'"}, "'sql'"),
    ({"sql": "SELECT ?, ?", "parameters": ["ok", "x\udfff"]}, "'parameters[1]'"),
    ({"sql": "SELECT 1", "consistency_token": "\ud83d"}, "'consistency_token'"),
])
def test_unpaired_surrogates_are_named(body: dict, field: str) -> None:
    msg = field_error(body)
    assert field in msg and "surrogate" in msg


def test_dialect_is_passed_on_or_named() -> None:
    assert sql_request_from_body({"sql": "SELECT 1", "dialect": "postgres"})[0].dialect == "postgres"
    assert sql_request_from_body({"sql": "SELECT 1"})[0].dialect is None
    for bad in (5, "", ["postgres"]):
        assert "'dialect'" in field_error({"sql": "SELECT 1", "dialect": bad})


def test_a_surrogate_pair_is_text() -> None:
    assert sql_request_from_body({"sql": "SELECT '\U0001f600'"})[0].sql == "SELECT '\U0001f600'"


def test_huge_values_are_shown_short() -> None:
    assert len(field_error({"sql": "SELECT 1", "allow_stale": "y" * 100_000})) < 300
    assert len(field_error({"sql": ["x"] * 100_000})) < 300
    assert len(refused(sql_request_from_body, {"sql": "SELECT 1", **{f"f{i}": 1 for i in range(10_000)}}).message) < 400


# --- the body as bytes, and what escapes the engine ---------------------------------------------


class Node:
    def __init__(self, fail_with: BaseException | None = None) -> None:
        self.fail_with = fail_with
        self.requests: list[SqlRequest] = []

    def sql(self, request: SqlRequest) -> SqlResult:
        self.requests.append(request)
        if self.fail_with is not None:
            raise self.fail_with
        return SqlResult(pa.schema([("a", pa.int64())]), iter([pa.record_batch([pa.array([1])], names=["a"])]), "t", {})


def answer(body: bytes, node: Node | None = None, **environ: Any) -> tuple[int, dict]:
    env = {"REQUEST_METHOD": "POST", "PATH_INFO": "/v1/sql", "CONTENT_LENGTH": str(len(body)),
           "wsgi.input": io.BytesIO(body), **environ}
    resp = sql_response(node or Node(), env)
    status = int(getattr(resp, "status_code", 200))  # a whole JSON answer is a bare WSGI app
    return status, resp.get_json() if status != 200 else {}


def test_json_nested_too_deep_is_a_400() -> None:
    for body in (b"[" * 100_000 + b"]" * 100_000, b'{"sql": "SELECT 1", "parameters": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"):
        status, out = answer(body)
        assert status == 400 and "too deeply" in out["error"]["message"]


def test_invalid_utf8_is_a_400_that_says_so() -> None:
    status, out = answer(b'{"sql": "SELECT \'\xff\'"}')
    assert status == 400 and "0xff" in out["error"]["message"] and "UTF-8" in out["error"]["message"]


def test_parameters_read_from_the_body_keep_their_exact_values() -> None:
    # the body is read in C (orjson) unless it holds a number it would not keep exact (an int past
    # 64 bits) or a value only the json module takes (NaN): then as the json module reads it
    huge, node = 2**70 + 3, Node()
    for body, expected in ((b'{"sql": "SELECT ?", "parameters": [%d, -%d]}' % (huge, huge), [huge, -huge]),
                           (b'{"sql": "SELECT ?", "parameters": [18446744073709551615, 0.1, "\u00e9"]}',
                            [2**64 - 1, 0.1, "\u00e9"]),
                           (b'{"sql": "SELECT ?", "parameters": [1e400, 2]}', [float("inf"), 2])):
        assert answer(body, node)[0] == 200
        got = node.requests[-1].parameters
        assert got == expected and list(map(type, got)) == list(map(type, expected)), body
    assert answer(b'{"sql": "SELECT ?", "parameters": [NaN]}', node)[0] == 200
    assert node.requests[-1].parameters[0] != node.requests[-1].parameters[0]  # NaN, as the json module reads it
    status, out = answer(b'{"sql": "SELECT 1",}')
    assert status == 400 and "not valid JSON: Expecting property name enclosed in double quotes" in out["error"]["message"]


def test_a_body_over_the_cap_is_refused_unread() -> None:
    status, out = answer(b"{}", CONTENT_LENGTH=str(MAX_BODY_BYTES + 1))
    assert status == 413 and out["error"]["code"] == "REQUEST_TOO_LARGE"
    assert "16 MiB" in out["error"]["message"] and "--max-body-bytes" in out["error"]["message"]
    status, out = answer(b"{}", CONTENT_LENGTH="12abc")
    assert status == 400 and "Content-Length" in out["error"]["message"]


def test_a_chunked_body_over_the_cap_is_refused() -> None:
    body = b'{"sql": "SELECT 1", "x": "' + b"a" * MAX_BODY_BYTES + b'"}'
    status, out = answer(body, CONTENT_LENGTH="", HTTP_TRANSFER_ENCODING="chunked", **{"wsgi.input_terminated": True})
    assert status == 413 and "more than 16,777,216 bytes" in out["error"]["message"]


def test_recursion_in_the_engine_is_a_400(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "federator.http"):
        status, out = answer(b'{"sql": "SELECT 1"}', Node(RecursionError("maximum recursion depth exceeded")))
    assert status == 400 and out["error"]["code"] == "SQL_PARSE_ERROR" and "too deeply" in out["error"]["message"]
    assert caplog.records[-1].exc_info is not None  # with its stack, to find the recursion


def test_overflow_in_the_engine_is_a_400() -> None:
    status, out = answer(b'{"sql": "SELECT 1"}', Node(OverflowError("Python int too large to convert to C long")))
    assert status == 400 and out["error"]["code"] == "INVALID_DATA" and "64 bits" in out["error"]["message"]


def test_any_other_exception_is_a_500_logged_with_its_stack(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, "federator.http"):
        status, out = answer(b'{"sql": "SELECT 1"}', Node(KeyError("boom")))
    assert status == 500 and out["error"]["code"] == "INTERNAL"
    record = caplog.records[-1]
    assert record.levelno == logging.ERROR and record.exc_info and record.exc_info[0] is KeyError
