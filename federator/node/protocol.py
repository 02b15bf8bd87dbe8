"""What the layers above a node (dispatch and SQL) read of it: ``ServingNode``.

The node process implements it (``federator.node.node.Node``); so do the tests' small nodes,
so that dispatch and SQL type against it and never probe the node for what it may lack.
"""

from __future__ import annotations

from typing import Iterable, Protocol

from federator.catalog.definition import StoreDefinition
from federator.cluster.membership import ClusterView
from federator.metrics import Metrics
from federator.owner.duck import Duck
from federator.query.position import Position, PositionBound
from federator.query.queries import Query
from federator.query.request import StateQueryRequest
from federator.query.result import QueryResult
from federator.store.layer import StoredEntry
from federator.tls import Tls


class ServingConfig(Protocol):
    """The node's settings that dispatch and SQL read (``NodeConfig``, or ``NodeSettings``)."""

    @property
    def partition_answers_mb(self) -> int: ...

    @property
    def reuse_answers_seconds(self) -> float: ...

    @property
    def statement_answers(self) -> int: ...


class ServingNode(Protocol):
    @property
    def node_id(self) -> str: ...

    @property
    def endpoint(self) -> str:
        """Its HTTP address, as other nodes call it."""
        ...

    @property
    def cluster_secret(self) -> str | None:
        """What node-to-node calls carry."""
        ...

    @property
    def tls(self) -> Tls | None:
        """Whom it trusts when it calls peers."""
        ...

    @property
    def config(self) -> ServingConfig: ...

    @property
    def stores(self) -> dict[str, StoreDefinition]:
        """The catalog's stores this node can read."""
        ...

    @property
    def unusable_stores(self) -> dict[str, str]:
        """Store -> why this node cannot read it."""
        ...

    @property
    def view(self) -> ClusterView: ...

    @property
    def metrics(self) -> Metrics: ...

    @property
    def duck(self) -> Duck: ...

    def catalog_read(self) -> bool:
        """Whether the catalog has been read to its end once."""
        ...

    def execute(self, request: StateQueryRequest) -> list[QueryResult]:
        """This node's answers to a per-partition query over partitions it hosts."""
        ...

    def read_together(self, store: str, query: Query, require_active: bool) -> QueryResult | None:
        """A global store's ``query`` answered from this node's copies of every partition at
        once (its rows, and the Position read of each); None when it cannot be so now."""
        ...

    def read_local(self, store: str, partition: int, key: bytes, bound: PositionBound) -> StoredEntry | None:
        """A key's stored entry from this node's active, current copy; None when it cannot serve it so."""
        ...

    def answerable_offsets_of(self, store: str, partitions: Iterable[int]) -> tuple[int, list[int]] | None:
        """(epoch, the offset of each of ``partitions``) this node would answer as their current
        active copy; None when it would not answer one of them so."""
        ...

    def local_lag(self, store: str, partition: int) -> int | None:
        """Records this node's copy of the partition is behind its changelog's end."""
        ...

    def unchanged_since(self, store: str, query: Query, since: Position) -> bool:
        """Whether a global store's ``query`` answers now what it answered at ``since``."""
        ...

    def wait_applied(self, store: str, offsets: dict[int, int], deadline: float) -> None:
        """Until this node's copies have applied ``offsets`` (partition -> offset), or ``deadline``."""
        ...
