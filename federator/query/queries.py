"""IQv2 query types.

Queries hold typed key values (str, int, float, bytes); the store serializes them
with its key format. They travel between nodes as JSON dicts named by ``type``; which
class a name stands for is the registry's (federator.plugin.registry), passed in.
"""

from __future__ import annotations

import base64
import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

from federator.errors import FederatorError


class UnknownQueryType(FederatorError, KeyError):
    """A query type a process has no class for (a plugin that is not installed there): this one,
    decoding a query; or, with ``node_id``, the node a dispatched query reached, which said why
    in ``reason``. A KeyError, as a name a lookup did not find."""

    code = "UNKNOWN_QUERY_TYPE"

    def __init__(self, type_name: str, node_id: str | None = None, reason: str = "") -> None:
        self.type_name, self.node_id, self.reason = type_name, node_id, reason
        if node_id is None:
            message = f"unknown query type {type_name!r}: install the plugin that provides it on every node"
        else:
            message = f"node {node_id} cannot answer {type_name}: {reason}"
        super().__init__(message)

    def __str__(self) -> str:  # KeyError's would quote the message
        return self.message


def encode_value(v: Any) -> Any:
    """JSON-safe form of a key value (bytes become {"$b64": ...})."""
    if isinstance(v, (bytes, bytearray, memoryview)):
        return {"$b64": base64.b64encode(bytes(v)).decode()}
    return v


def decode_value(v: Any) -> Any:
    if isinstance(v, dict) and set(v) == {"$b64"}:
        return base64.b64decode(v["$b64"])
    return v


@dataclass(frozen=True)
class Query:
    """Base of all query types. Subclasses are frozen dataclasses with a unique ``type_name``."""

    type_name: ClassVar[str] = "Query"
    # Whether its answer depends on nothing but the partition's data and the query itself, so
    # a partition may give the answer again while nothing is written to it (the shard-answer
    # layer, federator.store.shard_answers). A query type whose handler reads anything else
    # (the clock, another system) sets it False.
    reusable: ClassVar[bool] = True

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: encode_value(getattr(self, f.name)) for f in dataclasses.fields(self)}
        d["type"] = self.type_name
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Query:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: decode_value(v) for k, v in d.items() if k in names})


@dataclass(frozen=True)
class KeyQuery(Query):
    """The value of one key (kv stores)."""

    type_name: ClassVar[str] = "KeyQuery"
    key: Any


@dataclass(frozen=True)
class KeysQuery(Query):
    """The values of several keys (kv stores): each partition answers for the keys it holds."""

    type_name: ClassVar[str] = "KeysQuery"
    keys: tuple[Any, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type_name, "keys": [encode_value(k) for k in self.keys]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Query:
        return cls(tuple(decode_value(k) for k in d["keys"]))


@dataclass(frozen=True)
class RangeQuery(Query):
    """Keys in [lower, upper] (either bound open when None), in key order; no bounds = all keys."""

    type_name: ClassVar[str] = "RangeQuery"
    lower: Any = None
    upper: Any = None
    lower_inclusive: bool = True
    upper_inclusive: bool = True
    descending: bool = False


@dataclass(frozen=True)
class WindowKeyQuery(Query):
    """Windows of one key whose start lies in [time_from, time_to] (epoch ms, None = open)."""

    type_name: ClassVar[str] = "WindowKeyQuery"
    key: Any
    time_from: int | None = None
    time_to: int | None = None


@dataclass(frozen=True)
class WindowRangeQuery(Query):
    """All keys' windows whose start lies in [time_from, time_to] (epoch ms, None = open).

    Session stores answer it with the sessions that overlap [time_from, time_to].
    """

    type_name: ClassVar[str] = "WindowRangeQuery"
    time_from: int | None = None
    time_to: int | None = None


@dataclass(frozen=True)
class SessionQuery(Query):
    """Sessions of one key that overlap [time_from, time_to]: end >= time_from and start <= time_to."""

    type_name: ClassVar[str] = "SessionQuery"
    key: Any
    time_from: int | None = None
    time_to: int | None = None


def query_from_dict(d: Mapping[str, Any], types: Mapping[str, type[Query]]) -> Query:
    """The query ``d`` describes, its class found by name among ``types`` (a registry's query types)."""
    type_name = d.get("type")
    cls = types.get(type_name) if isinstance(type_name, str) else None
    if cls is None:
        raise UnknownQueryType(str(type_name))
    return cls.from_dict(dict(d))
