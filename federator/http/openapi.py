"""The node's HTTP API as an OpenAPI 3.1 document, served at GET /openapi.json.

Written here beside the routes (tests/unit/test_openapi.py fails when a route of the app is
missing from it, or it names one the app does not have), so clients and the docs site read
one description.
"""

from __future__ import annotations

from typing import Any

from federator import __version__
from federator.errors import CODES, error_schema

_ERROR = {"$ref": "#/components/schemas/Error"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*statuses: int) -> dict[str, Any]:
    """The error responses of a route that answers ``statuses``, each naming its codes (federator.errors)."""
    codes = {s: sorted(c for c, row in CODES.items() if row.http == s) for s in statuses}
    return {str(s): _json(_ERROR, "codes: " + ", ".join(codes[s])) for s in statuses}


def _public(*statuses: int) -> dict[str, Any]:
    """A public route's: a node with --users-file also answers 401, and 429 to an address shut out."""
    return _errors(*sorted({*statuses, 401, 429}))


_SQL_REQUEST = {
    "type": "object", "required": ["sql"],
    "properties": {
        "sql": {"type": "string", "description": "one read statement (SELECT, WITH, SHOW TABLES, DESCRIBE, EXPLAIN)"},
        "parameters": {"type": "array", "description": "values of the ? or $n placeholders, in order"},
        "consistency_token": {"type": ["string", "null"],
                              "description": "read at least this far: a token an earlier answer or write gave"},
        "allow_stale": {"type": "boolean", "default": False,
                        "description": "a standby may answer when the active owner cannot"},
        "max_lag": {"type": ["integer", "null"], "description": "with allow_stale: records a standby may lag"},
        "timeout_ms": {"type": "integer", "default": 10000, "description": "capped by the node's --max-timeout-ms"},
        "dialect": {"type": ["string", "null"], "description": "the SQL's dialect as sqlglot names it; null: DuckDB's"},
        "format": {"type": "string", "enum": ["json", "ndjson", "csv", "arrow"], "default": "json"},
    },
}
_SQL_ANSWER = {
    "type": "object",
    "properties": {
        "columns": {"type": "array", "items": {"type": "object", "properties": {
            "name": {"type": "string"}, "type": {"type": "string"}}}},
        "rows": {"type": "array", "items": {"type": "array"}},
        "consistency_token": {"type": "string", "description": "the positions this answer reflects"},
        "stats": {"type": "object", "description": "partitions_queried, nodes, rows, elapsed_ms, ..."},
    },
}
_PUBLIC = [{"bearerAuth": []}, {}]  # a bearer token when the node has --users-file


def document() -> dict[str, Any]:
    def op(summary: str, responses: dict[str, Any], **more: Any) -> dict[str, Any]:
        return {"summary": summary, "responses": responses, **more}

    path_param = lambda name, what: {"name": name, "in": "path", "required": True,  # noqa: E731
                                     "schema": {"type": "string"}, "description": what}
    return {
        "openapi": "3.1.0",
        "info": {"title": "Federator node", "version": __version__,
                 "description": "SQL over the live state of a data pipeline. Every node answers every public route; "
                                "a query is routed to the partitions' owners."},
        "paths": {
            "/v1/sql": {"post": op(
                "Run a SQL statement over the stores",
                {"200": {"description": "the answer (JSON; NDJSON, CSV or Arrow IPC by Accept or format)",
                         "content": {"application/json": {"schema": _SQL_ANSWER},
                                     "application/x-ndjson": {}, "text/csv": {},
                                     "application/vnd.apache.arrow.stream": {}}},
                 **_public(400, 404, 409, 413, 422, 503, 504)},
                requestBody={"required": True, "content": {"application/json": {"schema": _SQL_REQUEST}}},
                security=_PUBLIC)},
            "/v1/stores": {"get": op("The stores, with their columns and SQL types",
                                     {"200": _json({"type": "array", "items": {"type": "object"}}, "stores"),
                                      **_public()}, security=_PUBLIC)},
            "/v1/stores/{name}": {"get": op(
                "One store: its definition, columns and each partition's active and standby owners with lag",
                {"200": _json({"type": "object"}, "the store"), **_public(404)},
                parameters=[path_param("name", "the store")], security=_PUBLIC)},
            "/v1/stores/{name}/keys/{key}": {"get": op(
                "A routed point lookup: the key's row as a JSON object (404 when absent)",
                {"200": _json({"type": "object"}, "the row"), **_public(400, 404, 503, 504)},
                parameters=[path_param("name", "the store"), path_param("key", "the key, as text")],
                security=_PUBLIC)},
            "/v1/plugins": {"get": op("The plugins loaded, what each provides, and the ones that failed",
                                      {"200": _json({"type": "object"}, "plugins"), **_public()},
                                      security=_PUBLIC)},
            "/v1/metadata": {"get": op("The cluster view: nodes, the partitions each holds, lags and positions",
                                       {"200": _json({"type": "object"}, "the routing view"), **_public()},
                                       security=_PUBLIC)},
            "/v1/metadata/stores/{store}/keys/{key}": {"get": op(
                "Which partition holds a key, and its active and standby nodes",
                {"200": _json({"type": "object"}, "the key's partition and owners"), **_public(400, 404)},
                parameters=[path_param("store", "the store"), path_param("key", "the key, as text")],
                security=_PUBLIC)},
            "/healthz": {"get": op("The process answers (open without a token)", {"200": {"description": "alive"}})},
            "/readyz": {"get": op("Every partition this node is active for is restored (open without a token)",
                                  {"200": {"description": "ready"}, "503": {"description": "not yet; says why"}})},
            "/metrics": {"get": op("Prometheus metrics (open without a token)",
                                   {"200": {"description": "text exposition format",
                                            "content": {"text/plain": {}}}})},
            "/openapi.json": {"get": op("This document (open without a token)",
                                        {"200": _json({"type": "object"}, "OpenAPI 3.1")})},
            "/": {"get": op("The console (open; its calls need a token when the node has users)",
                            {"200": {"description": "HTML", "content": {"text/html": {}}}})},
            "/console/{name}": {"get": op("The console's scripts and styles",
                                          {"200": {"description": "a file of the console"}, **_errors(404)},
                                          parameters=[path_param("name", "the file")])},
            "/internal/v1/query": {"post": op(
                "Node to node: per-partition queries of one store (authenticated by the cluster secret)",
                {"200": {"description": "the per-partition results as an Arrow stream",
                         "content": {"application/vnd.apache.arrow.stream": {}}},
                 **_errors(400, 403, 404, 422)},
                **{"x-internal": True})},
        },
        "components": {
            "schemas": {"Error": error_schema()},
            "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer",
                                               "description": "a token `federator users add` printed"}},
        },
    }
