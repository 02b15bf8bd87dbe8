"""IQv2 queries and requests travel between nodes as JSON dicts."""

from __future__ import annotations

import json
import types
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest

from federator.query import (
    KeyQuery,
    KeysQuery,
    Position,
    PositionBound,
    Query,
    RangeQuery,
    SessionQuery,
    StateQueryRequest,
    WindowKeyQuery,
    WindowRangeQuery,
)
from federator.plugin import hookimpl, load_plugins
from federator.query.queries import UnknownQueryType, query_from_dict
from tests.registry import REGISTRY

QUERIES = [
    KeyQuery("alice"),
    KeyQuery(42),
    KeyQuery(-1.5),
    KeyQuery(b"\x00\xff\x10raw"),
    KeyQuery(b""),
    RangeQuery(),
    RangeQuery(lower=-5, upper=10, lower_inclusive=False, upper_inclusive=False, descending=True),
    RangeQuery(lower="a", upper=None),
    RangeQuery(lower=b"\x80", upper=b"\xff\xff"),
    RangeQuery(lower=-0.5, upper=2.25),
    WindowKeyQuery("k"),
    WindowKeyQuery(b"\x01\x02", time_from=0, time_to=1_700_000_000_000),
    WindowKeyQuery(7, time_from=None, time_to=100),
    WindowRangeQuery(),
    WindowRangeQuery(time_from=10, time_to=20),
    SessionQuery("user"),
    SessionQuery(b"\xfe", time_from=5, time_to=None),
]


@pytest.mark.parametrize("q", QUERIES, ids=repr)
def test_query_round_trip(q: Query) -> None:
    d = q.to_dict()
    assert d["type"] == q.type_name == type(q).__name__
    wire = json.loads(json.dumps(d))  # it really is JSON-safe
    again = REGISTRY.query_from_dict(wire)
    assert type(again) is type(q)
    assert again == q
    for name, value in vars(q).items():
        assert type(getattr(again, name)) is type(value)


def test_bytes_travel_as_base64() -> None:
    d = KeyQuery(b"\x00\xff").to_dict()
    assert d == {"key": {"$b64": "AP8="}, "type": "KeyQuery"}


def test_every_builtin_is_registered() -> None:
    types = load_plugins(names=()).query_types  # the built-in plugin alone
    for cls in (KeyQuery, KeysQuery, RangeQuery, WindowKeyQuery, WindowRangeQuery, SessionQuery):
        assert types[cls.type_name] is cls


def test_defaults_fill_missing_fields() -> None:
    assert REGISTRY.query_from_dict({"type": "RangeQuery"}) == RangeQuery()
    assert REGISTRY.query_from_dict({"type": "WindowKeyQuery", "key": "k"}) == WindowKeyQuery("k", None, None)


def test_unknown_query_type_names_the_type() -> None:
    with pytest.raises(UnknownQueryType) as e:
        REGISTRY.query_from_dict({"type": "TopNQuery", "n": 3})
    assert e.value.type_name == "TopNQuery"
    assert "TopNQuery" in str(e.value)
    assert "plugin" in str(e.value)
    assert isinstance(e.value, KeyError)


def test_missing_type_is_unknown() -> None:
    with pytest.raises(UnknownQueryType) as e:
        query_from_dict({"key": "k"}, REGISTRY.query_types)
    assert e.value.type_name == "None"


def _plugin(*query_types: type[Query]) -> object:
    return types.SimpleNamespace(register_query_types=hookimpl(lambda: list(query_types)))


def test_a_plugin_cannot_take_a_query_type_name_another_has() -> None:
    @dataclass(frozen=True)
    class Impostor(Query):
        type_name: ClassVar[str] = "KeyQuery"
        key: Any = None

    registry = load_plugins({"impostor": _plugin(Impostor)}, names=())
    (failure,) = registry.failures
    assert failure.name == "impostor"
    assert "query type KeyQuery is already registered by the plugin 'federator'" in failure.error
    assert registry.query_types["KeyQuery"] is KeyQuery
    assert type(registry.query_from_dict({"type": "KeyQuery", "key": 1})) is KeyQuery


def test_a_plugin_query_type_travels_in_its_registry_only() -> None:
    @dataclass(frozen=True)
    class TopNQuery(Query):
        type_name: ClassVar[str] = "TopNQuery"
        n: int = 10
        prefix: Any = None

    registry = load_plugins({"topn": _plugin(TopNQuery)}, names=())
    assert registry.failures == () and registry.provider_of("query type TopNQuery") == "topn"
    q = TopNQuery(n=3, prefix=b"\x01")
    again = registry.query_from_dict(json.loads(json.dumps(q.to_dict())))
    assert again == q and type(again) is TopNQuery
    # no registry is shared: another one, and the tests' own, never saw it
    assert "TopNQuery" not in load_plugins(names=()).query_types
    assert "TopNQuery" not in REGISTRY.query_types


# ---- StateQueryRequest ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "req",
    [
        StateQueryRequest("orders", KeyQuery("a")),
        StateQueryRequest(
            "orders",
            RangeQuery(lower=b"\x00", upper=b"\x7f", descending=True),
            partitions=(0, 3, 5),
            bound=PositionBound.at(Position({"app-orders-changelog": {0: 10, 3: 0}})),
            require_active=True,
            collect_execution_info=True,
        ),
        StateQueryRequest("w", WindowKeyQuery(5, 0, 100), partitions=()),
    ],
    ids=["simple", "everything", "no-partitions"],
)
def test_request_round_trip(req: StateQueryRequest) -> None:
    d = json.loads(json.dumps(req.to_dict()))
    again = StateQueryRequest.from_dict(d, REGISTRY.query_types)
    assert again == req
    assert again.partitions == req.partitions
    assert again.bound.to_dict() == req.bound.to_dict()


def test_request_defaults() -> None:
    req = StateQueryRequest.from_dict({"store": "s", "query": {"type": "KeyQuery", "key": "x"}}, REGISTRY.query_types)
    assert req.partitions is None
    assert req.bound.is_unbounded
    assert not req.require_active and not req.collect_execution_info


def test_request_with_unknown_query_type() -> None:
    with pytest.raises(UnknownQueryType):
        StateQueryRequest.from_dict({"store": "s", "query": {"type": "Nope"}}, REGISTRY.query_types)
