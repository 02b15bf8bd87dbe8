"""The built-in plugin: Federator's own formats, store types and query types, registered
through the same hooks as any installed plugin (Datasette sends its DEFAULT_PLUGINS the
same way). The loader always loads it first, whatever ``FEDERATOR_PLUGINS`` says, so
plugins can build on what it registers (teach ``kv`` a query, subclass its store types).
"""

from __future__ import annotations

from federator.formats import BytesFormat, DoubleFormat, Format, IntFormat, JsonFormat, LongFormat, StringFormat
from federator.plugin.hookspecs import hookimpl
from federator.query.queries import (
    KeyQuery,
    KeysQuery,
    Query,
    RangeQuery,
    SessionQuery,
    WindowKeyQuery,
    WindowRangeQuery,
)
from federator.store.kv import KeyValueStoreType
from federator.store.session import SessionStoreType
from federator.store.types import StoreType
from federator.store.versioned import VersionedStoreType
from federator.store.window import WindowStoreType

NAME = "federator"  # how `federator plugins` and the log name it


@hookimpl
def register_formats() -> list[Format]:
    # json is a template: each store gets its own over its declared fields
    return [StringFormat(), BytesFormat(), LongFormat(), IntFormat(), DoubleFormat(), JsonFormat()]


@hookimpl
def register_store_types() -> list[StoreType]:
    return [KeyValueStoreType(), WindowStoreType(), SessionStoreType(), VersionedStoreType()]


@hookimpl
def register_query_types() -> list[type[Query]]:
    return [KeyQuery, KeysQuery, RangeQuery, WindowKeyQuery, WindowRangeQuery, SessionQuery]
