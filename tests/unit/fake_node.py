"""The unit tests' small node: ``federator.node.protocol.ServingNode`` with nothing hosted.

A test's fake subclasses it and overrides what it plays (its view, its stores, ``execute``);
the rest answers as a node that hosts nothing and has read its catalog.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, Iterable

from federator.catalog.definition import StoreDefinition
from federator.cluster.membership import ClusterView
from federator.metrics import Metrics
from federator.owner.duck import Duck
from federator.query.position import PositionBound
from federator.query.request import StateQueryRequest
from federator.query.result import QueryResult
from federator.settings import NodeSettings
from federator.store.layer import StoredEntry
from federator.tls import Tls


class FakeNode:
    node_id: str = "me"
    endpoint: str = "me:1"
    cluster_secret: str | None = None
    tls: Tls | None = None

    def __init__(self, view: ClusterView | None = None, stores: dict[str, StoreDefinition] | None = None) -> None:
        self.view = view if view is not None else ClusterView()
        self.stores: dict = stores if stores is not None else {}
        self.unusable_stores: dict[str, str] = {}
        self.config = NodeSettings()
        self.metrics = Metrics()

    @cached_property
    def duck(self) -> Duck:
        return Duck()

    def catalog_read(self) -> bool:
        return True

    def execute(self, request: StateQueryRequest) -> list[QueryResult]:
        raise AssertionError("no local partitions")

    def read_local(self, store: str, partition: int, key: bytes, bound: PositionBound) -> StoredEntry | None:
        return None

    def answerable_offsets_of(self, store: str, partitions: Iterable[int]) -> tuple[int, list[int]] | None:
        return None

    def local_lag(self, store: str, partition: int) -> int | None:
        return None

    def unchanged_since(self, store: str, query: Any, since: Any) -> bool:
        return False

    def wait_applied(self, store: str, offsets: dict[int, int], deadline: float) -> None:
        return None
