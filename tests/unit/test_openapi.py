"""GET /openapi.json describes exactly the routes the node's app serves."""

from __future__ import annotations

import re

from federator.http import create_app
from federator.http.openapi import document
from tests.unit.test_http_app import REGISTRY, FakeNode


class FakeSql:
    """The SQL front's shape, for the routes to register (never called here)."""

    stores: dict = {}


def _routes(app) -> set[tuple[str, str]]:
    out = set()
    for rule in app.url_map.iter_rules():
        if rule.endpoint == "static":
            continue
        path = re.sub(r"<(?:[a-z]+:)?([a-z_]+)>", r"{\1}", rule.rule)
        out |= {(m.lower(), path) for m in rule.methods - {"HEAD", "OPTIONS"}}
    return out


def test_every_route_is_documented_and_nothing_else() -> None:
    app = create_app(FakeNode(), REGISTRY, FakeSql())
    documented = {(method, path) for path, ops in document()["paths"].items() for method in ops}
    assert _routes(app) == documented


def test_the_node_serves_the_document_without_a_token() -> None:
    from federator.auth import Users, Verifier

    app = create_app(FakeNode(), REGISTRY, FakeSql(), Users({"alice": Verifier.of("t")}))
    client = app.test_client()
    resp = client.get("/openapi.json")
    assert resp.status_code == 200 and resp.json["openapi"].startswith("3.")
    assert client.get("/v1/stores").status_code == 401  # the routes it describes still need one
    codes = resp.json["components"]["schemas"]["Error"]["properties"]["error"]["properties"]["code"]["enum"]
    assert "UNAVAILABLE" in codes and "TOO_MANY_QUERIES" in codes
