"""What the layers above a node (dispatch and SQL) read of it: ``ServingNode``.

The node process implements it (``federator.node.node.Node``); so do the tests' small nodes,
so that dispatch and SQL type against it and never probe the node for what it may lack.
"""

from __future__ import annotations

from typing import Protocol

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


class ServingNode(Protocol):
    node_id: str
    endpoint: str  # its HTTP address, as other nodes call it
    cluster_secret: str | None  # what node-to-node calls carry
    tls: Tls | None  # whom it trusts when it calls peers
    config: NodeSettings
    stores: dict[str, StoreDefinition]  # the catalog's stores this node can read
    unusable_stores: dict[str, str]  # store -> why this node cannot read it
    view: ClusterView
    metrics: Metrics

    @property
    def duck(self) -> Duck: ...

    def catalog_read(self) -> bool:
        """Whether the catalog has been read to its end once."""
        ...

    def execute(self, request: StateQueryRequest) -> list[QueryResult]:
        """This node's answers to a per-partition query over partitions it hosts."""
        ...

    def read_local(self, store: str, partition: int, key: bytes, bound: PositionBound) -> StoredEntry | None:
        """A key's stored entry from this node's active, current copy; None when it cannot serve it so."""
        ...

    def answerable_offset(self, store: str, partition: int) -> tuple[int, int] | None:
        """(epoch, offset) of a partition this node would answer as its current active copy."""
        ...

    def local_lag(self, store: str, partition: int) -> int | None:
        """Records this node's copy of the partition is behind its changelog's end."""
        ...

    def wait_applied(self, store: str, offsets: dict[int, int], deadline: float) -> None:
        """Until this node's copies have applied ``offsets`` (partition -> offset), or ``deadline``."""
        ...
