"""IQv2 queries and requests travel between nodes as JSON dicts."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest

from federator.query import (
    KeyQuery,
    Position,
    PositionBound,
    Query,
    RangeQuery,
    SessionQuery,
    StateQueryRequest,
    WindowKeyQuery,
    WindowRangeQuery,
    query_from_dict,
    query_types,
    register_query_type,
)
from federator.query import queries as queries_module
from federator.query.queries import UnknownQueryType

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
    again = query_from_dict(wire)
    assert type(again) is type(q)
    assert again == q
    for name, value in vars(q).items():
        assert type(getattr(again, name)) is type(value)


def test_bytes_travel_as_base64() -> None:
    d = KeyQuery(b"\x00\xff").to_dict()
    assert d == {"key": {"$b64": "AP8="}, "type": "KeyQuery"}


def test_every_builtin_is_registered() -> None:
    types = query_types()
    for cls in (KeyQuery, RangeQuery, WindowKeyQuery, WindowRangeQuery, SessionQuery):
        assert types[cls.type_name] is cls


def test_defaults_fill_missing_fields() -> None:
    assert query_from_dict({"type": "RangeQuery"}) == RangeQuery()
    assert query_from_dict({"type": "WindowKeyQuery", "key": "k"}) == WindowKeyQuery("k", None, None)


def test_unknown_query_type_names_the_type() -> None:
    with pytest.raises(UnknownQueryType) as e:
        query_from_dict({"type": "TopNQuery", "n": 3})
    assert e.value.type_name == "TopNQuery"
    assert "TopNQuery" in str(e.value)
    assert "plugin" in str(e.value)
    assert isinstance(e.value, KeyError)


def test_missing_type_is_unknown() -> None:
    with pytest.raises(UnknownQueryType) as e:
        query_from_dict({"key": "k"})
    assert e.value.type_name == "None"


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Registrations made by a test are undone after it."""
    monkeypatch.setattr(queries_module, "_REGISTRY", dict(queries_module._REGISTRY))


def test_register_query_type_rejects_a_different_class_with_the_same_name(registry: None) -> None:
    @dataclass(frozen=True)
    class Impostor(Query):
        type_name: ClassVar[str] = "KeyQuery"
        key: Any = None

    with pytest.raises(ValueError) as e:
        register_query_type(Impostor)
    assert "'KeyQuery'" in str(e.value) and "already registered" in str(e.value)
    assert query_types()["KeyQuery"] is KeyQuery
    assert type(query_from_dict({"type": "KeyQuery", "key": 1})) is KeyQuery


def test_register_query_type_is_idempotent_and_makes_a_plugin_type_usable(registry: None) -> None:
    @dataclass(frozen=True)
    class TopNQuery(Query):
        type_name: ClassVar[str] = "TopNQuery"
        n: int = 10
        prefix: Any = None

    assert register_query_type(TopNQuery) is TopNQuery
    assert register_query_type(TopNQuery) is TopNQuery  # same class again is fine
    q = TopNQuery(n=3, prefix=b"\x01")
    again = query_from_dict(json.loads(json.dumps(q.to_dict())))
    assert again == q and type(again) is TopNQuery


def test_registry_fixture_isolation() -> None:
    # runs after the tests above: their plugin types are gone again
    assert "TopNQuery" not in query_types()


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
    again = StateQueryRequest.from_dict(d)
    assert again == req
    assert again.partitions == req.partitions
    assert again.bound.to_dict() == req.bound.to_dict()


def test_request_defaults() -> None:
    req = StateQueryRequest.from_dict({"store": "s", "query": {"type": "KeyQuery", "key": "x"}})
    assert req.partitions is None
    assert req.bound.is_unbounded
    assert not req.require_active and not req.collect_execution_info


def test_with_partitions_keeps_everything_else() -> None:
    req = StateQueryRequest("s", KeyQuery(1), None, PositionBound.at(Position.of("t", 0, 1)), True, True)
    narrowed = req.with_partitions([2, 1])
    assert narrowed.partitions == (2, 1)
    assert (narrowed.store, narrowed.query, narrowed.bound) == (req.store, req.query, req.bound)
    assert narrowed.require_active and narrowed.collect_execution_info
    assert req.partitions is None


def test_request_with_unknown_query_type() -> None:
    with pytest.raises(UnknownQueryType):
        StateQueryRequest.from_dict({"store": "s", "query": {"type": "Nope"}})
