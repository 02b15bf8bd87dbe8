"""A store's stack of layers as a node opens it (federator.store.layer describes them)."""

from __future__ import annotations

from pathlib import Path

from federator.catalog.definition import StoreDefinition
from federator.store.shard_answers import ShardAnswers, ShardAnswersLayer
from federator.store.layer import StoreLayer
from federator.store.metered import Meter, MeteredLayer
from federator.store.scan_cache import CachingLayer, ScanCache
from federator.store.shard import Shard


def open_store(path: str | Path, definition: StoreDefinition, partition: int,
               cache: ScanCache | None = None, meter: Meter | None = None,
               kept: ShardAnswers | None = None) -> StoreLayer:
    """Metered(ShardAnswers(Caching(Shard))): a layer is left out when its part is not given."""
    store: StoreLayer = Shard(path, definition, partition)
    if cache is not None:
        store = CachingLayer(store, cache)
    if kept is not None:
        store = ShardAnswersLayer(store, kept)
    if meter is not None:
        store = MeteredLayer(store, meter)
    return store
