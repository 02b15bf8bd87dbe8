"""A store on a node is a stack of layers, each answering the same ``run(query, bound)``.

The model is Kafka Streams' state stores (``Metered(Caching(RocksDB))``, WrappedStateStore): a
layer answers a query from what it holds or passes it down to the layer it wraps. A node's
stack is ``Metered(ShardAnswers(Caching(Shard)))`` (federator.store.stack.open_store). From the
bottom: the RocksDB shard (federator.store.shard: data, position, the one optimistic read), the
scan cache (federator.store.scan_cache: a shard's last full scan, following its writes), the
kept answers (federator.store.shard_answers: small answers given again until the shard's next
write), and metering (federator.store.metered: queries, rows and time per store and query
type). The
owner's pushed-down work runs once over all of a node's partitions, so it wraps the stacks at
node level (federator.owner), not inside one.

Writes (``apply``), the position and the shard's lifecycle go down to the shard through every
layer (a layer that keeps something derived from the data, like the cache, sees them pass).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable, ClassVar, NamedTuple, Sequence

import pyarrow as pa
from rocksdict import DbClosedError

from federator.query.position import Position, PositionBound
from federator.query.queries import Query
from federator.query.result import FailureReason, QueryResult

if TYPE_CHECKING:
    from federator.catalog.definition import StoreDefinition
    from federator.store.record import ChangelogRecord

UNBOUNDED = PositionBound.unbounded()


class UnsupportedQuery(Exception):
    """The store type has no handler for this query."""


class ShardClosed(Exception):
    """The shard was closed (its partition left this node in a rebalance) before or while a query read it."""


class LocalKeyQuery:
    """A KeyQuery asked in-process, for the point lookup: the key already serialized, answered
    with its stored bytes (a ``StoredEntry``), not an Arrow batch; the store type decodes them
    (``StoreType.decode_row``). Never sent over the wire, and no store type has a handler for
    it: the shard layer answers it itself. A slotted class, not a frozen dataclass: one is made
    per point lookup, and this costs half as much."""

    __slots__ = ("key_bytes",)
    type_name: ClassVar[str] = "LocalKeyQuery"

    def __init__(self, key_bytes: bytes) -> None:
        self.key_bytes = key_bytes

    def __repr__(self) -> str:
        return f"LocalKeyQuery({self.key_bytes!r})"


class StoredEntry(NamedTuple):
    """A LocalKeyQuery's answer: the key's stored bytes (None: no such key) and the Position
    they reflect. A tuple: one is made per point lookup."""

    stored: bytes | None
    position: Position


class StoreLayer:
    """One layer of a store. ``run`` answers a query as a per-partition result and never raises
    for store problems; a ``LocalKeyQuery`` is answered with a ``StoredEntry``, or None when
    this copy cannot answer it so (behind the bound, closed, failed: logged; the caller takes
    the general path, whose errors say why)."""

    definition: StoreDefinition
    partition: int
    # What the shard at the bottom keeps, and every layer reads through to it (WrappedLayer).
    topic: str
    position: Position
    offset: int | None
    source: str | None
    closed: bool
    # Whether this layer does anything with a LocalKeyQuery; one that only passes it down is
    # skipped for it (``key_layer``): the point lookup pays for no frame that does nothing.
    answers_local_keys: ClassVar[bool] = True

    @property
    def key_layer(self) -> StoreLayer:
        """The first layer, from this one down, that does something with a LocalKeyQuery."""
        return self

    def run(self, query: Query, bound: PositionBound = UNBOUNDED, collect_execution_info: bool = False) -> Any:
        raise NotImplementedError

    @property
    def base(self) -> StoreLayer:
        """The RocksDB layer at the bottom (federator.store.shard): what caches key a store's entries by."""
        raise NotImplementedError

    def changes_since(self, since: int, bound: PositionBound = UNBOUNDED) -> Any:
        """The rows written since write sequence ``since``, with the position and sequence they
        bring the store to, from a layer that holds them (the scan cache); None: no layer does."""
        return None

    # The shard's writes and lifecycle, which every layer passes down to it (WrappedLayer).
    def apply(self, records: Sequence[ChangelogRecord], through: int | None = None) -> tuple[int, int]:
        raise NotImplementedError

    def reset(self, source: str | None = None) -> None:
        raise NotImplementedError

    def set_source(self, topic_id: str) -> bool:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class WrappedLayer(StoreLayer):
    """A layer over another: what it does not answer goes down, and so do writes, the
    position and the lifecycle (what a shard is asked besides queries)."""

    answers_local_keys: ClassVar[bool] = False

    def __init__(self, inner: StoreLayer) -> None:
        self.inner = inner
        self.definition = inner.definition
        self.partition = inner.partition
        self.topic = inner.topic
        self._base = inner.base  # what a shard keeps is read from it in one step, not down every layer
        below = inner.key_layer
        self._key_layer = self if type(self).answers_local_keys else below
        self._run_key = below.run  # where this layer sends a LocalKeyQuery (see key_layer)

    @property
    def key_layer(self) -> StoreLayer:
        return self._key_layer

    @property
    def base(self) -> StoreLayer:
        return self._base

    def run(self, query: Query, bound: PositionBound = UNBOUNDED, collect_execution_info: bool = False) -> Any:
        return self.inner.run(query, bound, collect_execution_info)

    def changes_since(self, since: int, bound: PositionBound = UNBOUNDED) -> Any:
        return self.inner.changes_since(since, bound)

    def apply(self, records: Sequence[ChangelogRecord], through: int | None = None) -> tuple[int, int]:
        return self.inner.apply(records, through)

    def reset(self, source: str | None = None) -> None:
        self.inner.reset(source)

    def set_source(self, topic_id: str) -> bool:
        return self.inner.set_source(topic_id)

    def close(self) -> None:
        self.inner.close()

    # What a shard is read for besides queries, asked of the shard at the bottom. Spelled out,
    # not a __getattr__: a class with one pays for it on every attribute, the point path's too.
    @property
    def position(self) -> Position:
        return self._base.position

    @property
    def offset(self) -> int | None:
        return self._base.offset

    @property
    def source(self) -> str | None:
        return self._base.source

    @property
    def closed(self) -> bool:
        return self._base.closed


def answer(shard: StoreLayer, query: Query, bound: PositionBound, collect_execution_info: bool,
           read: Callable[[], tuple[pa.RecordBatch, Position]]) -> QueryResult:
    """``read()``'s answer as a per-partition result: the bound checked first, every failure
    typed (and a store failure logged), the execution info added when asked. What any layer
    that answers a query itself wraps its reading in."""
    if collect_execution_info:
        started = time.perf_counter()
        result = answer(shard, query, bound, False, read)
        took = (time.perf_counter() - started) * 1e6
        rows = result.batch.num_rows if result.batch is not None else 0
        outcome = "ok" if result.failure is None else result.failure.value
        result.execution_info.append(
            f"{shard.definition.type} store {shard.definition.name!r} partition {shard.partition}: "
            f"{query.type_name} {outcome}, {rows} rows in {took:.0f} us at offset {shard.offset}"
        )
        return result
    if bound.position is not None:  # (most reads have no token: nothing to check)
        unmet = unmet_bound(shard, bound, shard.position)
        if unmet is not None:
            return unmet
    try:
        batch, position = read()
    except UnsupportedQuery as e:
        return QueryResult.failed(shard.partition, FailureReason.UNKNOWN_QUERY_TYPE, str(e))
    except Exception as e:  # noqa: BLE001 - any store failure becomes a typed per-partition failure
        if shard.closed or isinstance(e, (ShardClosed, DbClosedError)):
            # A rebalance moved the partition off this node under the query: not a store
            # failure; NOT_PRESENT sends the caller to the partition's new owner.
            return QueryResult.failed(
                shard.partition,
                FailureReason.NOT_PRESENT,
                f"partition {shard.partition} of store {shard.definition.name!r} was closed on this node "
                "(moved by a rebalance) while the query ran; its new owner answers it",
            )
        return QueryResult.failed(
            shard.partition,
            FailureReason.STORE_EXCEPTION,
            f"store {shard.definition.name!r} partition {shard.partition}: {type(e).__name__}: {e}",
        )
    return QueryResult.success(shard.partition, batch, position)


def unmet_bound(shard: StoreLayer, bound: PositionBound, position: Position) -> QueryResult | None:
    """The failure of a read of ``shard`` at ``position`` that ``bound`` does not allow."""
    if bound.is_satisfied_by(position, shard.topic, shard.partition):
        return None
    wanted = bound.position.get(shard.topic, shard.partition) if bound.position else None
    return QueryResult.failed(
        shard.partition,
        FailureReason.NOT_UP_TO_BOUND,
        f"partition {shard.partition} of store {shard.definition.name!r} is at offset "
        f"{position.get(shard.topic, shard.partition)}, the bound asks for {wanted}",
    )
