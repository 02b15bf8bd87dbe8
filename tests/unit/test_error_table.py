"""The one table of error codes (federator.errors.CODES): every code the source can send is in it,
no error body is built anywhere else, and each front door answers a code as its row says."""

from __future__ import annotations

import ast
import importlib
import json
import pkgutil
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from werkzeug.exceptions import default_exceptions

import federator
from federator.dbapi import errors as dbapi
from federator.errors import CODES, FederatorError, SqlError, as_error
from federator.flight.errors import flight_error
from federator.http import create_app
from federator.http.errors import error_response, wsgi_error
from federator.http.openapi import document
from federator.pgwire.server import error_of
from tests.registry import REGISTRY
from tests.unit.test_http_app import FakeNode

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted((ROOT / "federator").rglob("*.py"))
TABLE_MODULE = ROOT / "federator" / "errors.py"


def _const(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _codes_in(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, code) for each code the module names: the first argument or ``code=`` of an
    error's construction, and the strings of a table whose name says it holds codes
    (``_HTTP_CODES``, ``OWNER_USER_ERRORS``). The error classes' own codes: ``_error_classes``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name.endswith("Error"):
                first = node.args[0] if node.args and name == "SqlError" else None
                keyword = next((k.value for k in node.keywords if k.arg == "code"), None)
                yield from ((node.lineno, c) for c in (_const(first), _const(keyword)) if c)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any("CODES" in getattr(t, "id", "") or "ERRORS" in getattr(t, "id", "") for t in targets):
                yield from ((node.lineno, c) for sub in ast.walk(node.value) if (c := _const(sub)) and c.isupper())


def _error_classes() -> list[type[FederatorError]]:
    """Every FederatorError class of federator/, each module imported to find them."""
    for info in pkgutil.walk_packages(federator.__path__, "federator."):
        importlib.import_module(info.name)
    found, todo = [], [FederatorError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return [cls for cls in found if cls.__module__.startswith("federator.")]


def _sent() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for cls in _error_classes():
        out.setdefault(cls.code, []).append(f"{cls.__module__}.{cls.__qualname__}")
    for path in SOURCES:
        if path == TABLE_MODULE:
            continue
        for line, code in _codes_in(ast.parse(path.read_text(), str(path))):
            out.setdefault(code, []).append(f"{path.relative_to(ROOT)}:{line}")
    return out


def test_every_code_the_source_sends_is_in_the_table() -> None:
    sent = _sent()
    assert len(sent) >= 15  # the scan finds the codes (it would pass vacuously on finding none)
    missing = {code: where for code, where in sent.items() if code not in CODES}
    assert missing == {}, "declare these in federator.errors.CODES"


def test_every_row_of_the_table_is_sent_somewhere() -> None:
    sent = _sent()
    assert [code for code in CODES if code not in sent] == []


def test_no_error_body_is_built_by_hand() -> None:
    """A ``{"error": {...}}`` literal outside federator.errors is a second way to build the body."""
    by_hand = []
    for path in SOURCES:
        if path == TABLE_MODULE:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Dict) and any(_const(k) == "error" and isinstance(v, ast.Dict)
                                                  for k, v in zip(node.keys, node.values)):
                by_hand.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert by_hand == []


def test_an_unknown_code_is_refused_where_it_is_raised() -> None:
    with pytest.raises(ValueError, match="declare it in federator.errors.CODES"):
        SqlError("NO_SUCH_CODE", "x")


@pytest.mark.parametrize("code", list(CODES))
def test_http_answers_the_rows_status_and_the_one_body(code: str) -> None:
    err = SqlError(code, "what was wrong", partitions=[2], retry_after=1.2)
    resp = error_response(err)
    assert resp.status_code == CODES[code].http and resp.mimetype == "application/json"
    assert json.loads(resp.get_data()) == {"error": {"code": code, "message": "what was wrong", "partitions": [2]}}
    assert resp.headers["Retry-After"] == "2"
    seen: list[Any] = []
    body = b"".join(wsgi_error(err, lambda status, headers: seen.extend([status, dict(headers)])))
    assert (json.loads(body), int(seen[0].split()[0])) == (json.loads(resp.get_data()), resp.status_code)
    assert seen[1]["Content-Length"] == str(len(body)) and seen[1]["Retry-After"] == "2"


def test_a_bug_is_internal_and_names_its_type() -> None:
    err = as_error(RuntimeError("disk full"))
    assert (err.code, err.status, err.message) == ("INTERNAL", 500, "RuntimeError: disk full")


# What a Flight client raises for each gRPC status the table names, as pyarrow maps them.
_CLIENT_SIDE = {
    "INVALID_ARGUMENT": pa.ArrowInvalid, "NOT_FOUND": KeyError, "UNIMPLEMENTED": NotImplementedError,
    "UNAVAILABLE": flight.FlightUnavailableError, "DEADLINE_EXCEEDED": flight.FlightTimedOutError,
    "UNAUTHENTICATED": flight.FlightUnauthenticatedError, "PERMISSION_DENIED": flight.FlightUnauthorizedError,
    "INTERNAL": flight.FlightInternalError,
}


class _Refusing(flight.FlightServerBase):
    """Answers an action named by a code with that code's error, as the node's handlers do."""

    def do_action(self, context: Any, action: flight.Action) -> Iterator[bytes]:
        raise flight_error(SqlError(action.type, f"refused with {action.type}"))


@pytest.fixture(scope="module")
def flight_client() -> Iterator[flight.FlightClient]:
    server = _Refusing("grpc://127.0.0.1:0")
    client = flight.connect(f"grpc://127.0.0.1:{server.port}")
    yield client
    client.close()
    server.shutdown()


@pytest.mark.parametrize("code", list(CODES))
def test_flight_sql_answers_the_rows_grpc_status(flight_client: flight.FlightClient, code: str) -> None:
    with pytest.raises(_CLIENT_SIDE[CODES[code].grpc]) as e:
        list(flight_client.do_action(flight.Action(code, b"")))
    assert f"{code}: refused with {code}" in str(e.value)


@pytest.mark.parametrize("code", list(CODES))
def test_postgres_answers_the_rows_sqlstate_with_the_code_in_the_detail(code: str) -> None:
    fields = error_of(SqlError(code, "what was wrong", partitions=[1, 3])).fields
    assert (fields["C"], fields["M"], fields["S"]) == (CODES[code].sqlstate, "what was wrong", "ERROR")
    assert fields["D"] == f"Federator error code {code}; partitions: [1, 3]"


@pytest.mark.parametrize("code", list(CODES))
def test_the_dbapi_driver_raises_the_rows_class_for_the_body(code: str) -> None:
    err = SqlError(code, "what was wrong", line=1, col=8)
    raised = dbapi.error_from_answer(err.status, json.loads(err.to_json()), retry_after="3")
    assert type(raised).__name__ == CODES[code].dbapi and isinstance(raised, dbapi.Error)
    assert (raised.code, raised.message, raised.status, raised.line, raised.col, raised.retry_after) == (
        code, "what was wrong", CODES[code].http, 1, 8, "3")


@pytest.mark.parametrize("status", sorted(s for s in default_exceptions if s != 401))
def test_the_http_servers_own_refusals_are_codes_of_the_table(status: int) -> None:
    app = create_app(FakeNode(), REGISTRY)
    app.add_url_rule("/refuse", "refuse", lambda: (_ for _ in ()).throw(default_exceptions[status]()))
    resp = app.test_client().get("/refuse")
    code = resp.json["error"]["code"]
    assert code in CODES and resp.status_code == CODES[code].http


def test_the_openapi_document_names_the_tables_codes_and_the_statuses_routes_answer() -> None:
    doc = document()
    assert doc["components"]["schemas"]["Error"]["properties"]["error"]["properties"]["code"]["enum"] == list(CODES)
    for path, ops in doc["paths"].items():
        for op in ops.values():
            for status, response in op["responses"].items():
                if status.startswith(("4", "5")) and "codes: " in response["description"]:
                    named = response["description"].removeprefix("codes: ").split(", ")
                    assert all(CODES[c].http == int(status) for c in named), (path, status)
    internal = doc["paths"]["/internal/v1/query"]["post"]["responses"]
    assert {"400", "403", "404", "422"} <= set(internal)  # a call without the cluster secret: 403 FORBIDDEN


def test_every_federator_error_renders_a_code_of_the_table() -> None:
    from federator.catalog.definition import DefinitionError
    from federator.dispatch.errors import NotUpToBound, Timeout, Unavailable
    from federator.kafka import KafkaUnavailable
    from federator.query.queries import UnknownQueryType

    for err in (DefinitionError("bad field"), Timeout("late", [1]), Unavailable("down", [0]), NotUpToBound("behind"),
                KafkaUnavailable("no broker"), UnknownQueryType("TopKQuery"), UnknownQueryType("TopKQuery", "n2", "why")):
        assert isinstance(err, FederatorError) and err.code in CODES
        assert err.to_dict()["error"]["message"] == str(err)
