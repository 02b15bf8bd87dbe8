"""Store types: how a changelog record is applied, the Arrow schema, and which queries are answered.

Built-in types are kv, window and session; plugins register more with ``register_store_type``.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Callable, ClassVar, Iterable, Sequence

import pyarrow as pa
from rocksdict import WriteBatch

from federator.formats import TIMESTAMP
from federator.query.queries import Query
from federator.store.record import ChangelogRecord

if TYPE_CHECKING:
    from federator.catalog.definition import StoreDefinition
    from federator.store.shard import ShardView

Handler = Callable[["ShardView", Query], pa.RecordBatch]

_TS = struct.Struct(">q")


def stored_value(record: ChangelogRecord) -> bytes:
    """What a shard keeps per key: the record timestamp (8 bytes) then the value bytes."""
    return _TS.pack(record.timestamp) + record.value  # type: ignore[operator]


class StoreType:
    """Base class. Subclasses set ``name`` and map query classes to handlers."""

    name: ClassVar[str]
    handlers: ClassVar[dict[type[Query], Handler]] = {}
    # How writers lay out changelog records: "kv", "window" or "session" (DESIGN.md).
    changelog_layout: ClassVar[str] = "kv"
    # Extra RocksDB column families in each shard (say, an index), written in the same
    # atomic batch as the data and the position, and emptied with them.
    column_families: ClassVar[tuple[str, ...]] = ()

    def schema(self, defn: StoreDefinition) -> pa.Schema:
        raise NotImplementedError

    def validate(self, defn: StoreDefinition) -> None:
        """Raise DefinitionError when ``defn`` does not suit this store type."""

    def apply(self, wb: WriteBatch, records: Iterable[ChangelogRecord], shard: ShardView) -> None:
        """Add a batch of changelog records to ``wb``; the shard writes it with the new position."""
        for r in records:
            if r.value is None:
                wb.delete(r.key)
            else:
                wb.put(r.key, stored_value(r))

    def is_full_scan(self, query: Query) -> bool:
        """Whether ``query`` reads the whole shard in key order (its answer may come from the scan cache)."""
        return False

    def follow_scan(self, defn: StoreDefinition, schema: pa.Schema, scan: pa.RecordBatch,
                    records: Sequence[ChangelogRecord]) -> pa.RecordBatch | None:
        """The full scan after ``records`` were applied to a shard whose full scan was ``scan``,
        or None to have the shard read again (the default)."""
        return None

    def handler_for(self, query: Query) -> Handler | None:
        return self.handlers.get(type(query))

    def add_handler(self, query_cls: type[Query], handler: Handler) -> None:
        """Teach this store type a new query (plugins that add queries to built-in types)."""
        self.handlers = {**self.handlers, query_cls: handler}


def rowtime_field() -> pa.Field:
    return pa.field("rowtime", TIMESTAMP)


_STORE_TYPES: dict[str, StoreType] = {}


def register_store_type(store_type: StoreType) -> None:
    existing = _STORE_TYPES.get(store_type.name)
    if existing is not None and type(existing) is not type(store_type):
        raise ValueError(f"store type {store_type.name!r} is already registered by {type(existing).__module__}")
    _STORE_TYPES[store_type.name] = store_type


def get_store_type(name: str) -> StoreType:
    _ensure_builtins()
    if name not in _STORE_TYPES:
        _load_plugins()
    try:
        return _STORE_TYPES[name]
    except KeyError:
        raise KeyError(
            f"unknown store type {name!r}: known are {', '.join(_STORE_TYPES)}; "
            "install the plugin that provides it"
        ) from None


def store_type_names() -> list[str]:
    _load_plugins()
    return list(_STORE_TYPES)


def _load_plugins() -> None:
    from federator.plugin.manager import load_plugins

    load_plugins()


def _ensure_builtins() -> None:
    # The built-in modules import this one, so they are loaded on first use rather than at import.
    from federator.store import kv, session, window  # noqa: F401  (they register themselves)
