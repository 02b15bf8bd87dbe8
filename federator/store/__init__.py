"""State stores: one RocksDB shard per store partition, its store type, and its query handlers."""

from federator.store.record import ChangelogRecord
from federator.store.shard import Shard, UnsupportedQuery
from federator.store.types import StoreType

__all__ = [
    "ChangelogRecord",
    "Shard",
    "StoreType",
    "UnsupportedQuery",
]
