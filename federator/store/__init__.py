"""State stores: per store partition a stack of layers over one RocksDB shard, its store type,
and its query handlers."""

from federator.store.layer import LocalKeyQuery, StoredEntry, StoreLayer
from federator.store.record import ChangelogRecord
from federator.store.shard import Shard, UnsupportedQuery
from federator.store.types import StoreType

__all__ = [
    "ChangelogRecord",
    "LocalKeyQuery",
    "StoredEntry",
    "StoreLayer",
    "Shard",
    "StoreType",
    "UnsupportedQuery",
]
