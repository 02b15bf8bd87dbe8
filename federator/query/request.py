"""A state query request: one store, one query, some partitions."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from federator.query.owner_work import OwnerWork
from federator.query.position import PositionBound
from federator.query.queries import Query, query_from_dict


@dataclass(frozen=True)
class StateQueryRequest:
    store: str
    query: Query
    partitions: tuple[int, ...] | None = None  # None = all partitions
    bound: PositionBound = field(default_factory=PositionBound.unbounded)
    require_active: bool = False
    collect_execution_info: bool = False
    work: OwnerWork | None = None  # what the owner does with the rows before answering; None: the rows

    def to_dict(self) -> dict[str, Any]:
        return {
            "store": self.store,
            "query": self.query.to_dict(),
            "partitions": None if self.partitions is None else list(self.partitions),
            "bound": self.bound.to_dict(),
            "require_active": self.require_active,
            "collect_execution_info": self.collect_execution_info,
            "work": None if self.work is None else self.work.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], query_types: Mapping[str, type[Query]]) -> StateQueryRequest:
        """The request ``d`` describes; ``query_types`` (the registry's) name its query's class."""
        parts = d.get("partitions")
        return cls(
            store=d["store"],
            query=query_from_dict(d["query"], query_types),
            partitions=None if parts is None else tuple(int(p) for p in parts),
            bound=PositionBound.from_dict(d.get("bound")),
            require_active=bool(d.get("require_active", False)),
            collect_execution_info=bool(d.get("collect_execution_info", False)),
            work=None if d.get("work") is None else OwnerWork.from_dict(d["work"]),
        )
