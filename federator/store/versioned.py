"""Versioned key-value stores (Kafka Streams' VersionedKeyValueStore, KIP-889): the latest value.

A versioned store's changelog is laid out as a kv store's (key -> value, null deletes), but a
record's place in time is its timestamp, not its offset: a record that arrives late (older
than what its key holds) is history, and the latest value stays the one with the newest
timestamp. Kafka Streams logs every version, in the order it got them, so the last record of a
key in the changelog need not be its latest value.

A shard keeps each key's latest version, as a kv shard does (rowtime = the version's
timestamp), and the timestamp of each key's newest delete in its own column family, so a late
record older than a delete does not bring the key back. A record whose timestamp equals the
latest one replaces it (as Kafka Streams' store does). Queries are the kv store's.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from rocksdict import WriteBatch

from federator.store.kv import KeyValueStoreType
from federator.store.layout import ROWTIME
from federator.store.record import ChangelogRecord
from federator.store.types import stored_value
from federator.store.view import ShardView

DELETES = "deleted_at"  # key -> the timestamp of its newest delete (8 bytes, big-endian epoch ms)


def _newest(shard: ShardView, key: bytes) -> int | None:
    """The timestamp of ``key``'s newest version in the shard (a value or a delete), None if none."""
    stored = shard.get(key)
    if stored is None:
        stored = shard.get(key, DELETES)
    return None if stored is None else ROWTIME.unpack_from(stored)[0]


class VersionedStoreType(KeyValueStoreType):
    name = "versioned"
    column_families = (DELETES,)

    def apply(self, wb: WriteBatch, records: Iterable[ChangelogRecord], shard: ShardView) -> None:
        deletes = shard.handle(DELETES)
        newest: dict[bytes, int | None] = {}  # what this batch has written so far, key -> timestamp
        for r in records:
            latest = newest[r.key] if r.key in newest else _newest(shard, r.key)
            if latest is not None and r.timestamp < latest:
                continue  # an older version: history, not the latest value
            if r.value is None:
                wb.delete(r.key)
                wb.put(r.key, ROWTIME.pack(r.timestamp), deletes)
            else:
                wb.put(r.key, stored_value(r))
                wb.delete(r.key, deletes)
            newest[r.key] = r.timestamp

    # Kept scans are read again after a write: the kv type's follow-up takes each key's last
    # record, which here may be a late one that changes nothing.
    def follow_scan(self, defn, schema, scan, records: Sequence[ChangelogRecord]):
        return None

    def stored_before(self, view: ShardView, records: Sequence[ChangelogRecord]) -> list[bytes | None] | None:
        return None
