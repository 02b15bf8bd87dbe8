"""The hooks a plugin can implement. Each returns a list of things to register.

The built-in plugin (federator.plugin.builtins) implements them too. pluggy calls an
implementation with only the arguments it names, so hooks can gain arguments later
without breaking plugins written today.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from federator.formats import Format
    from federator.plugin.rules import SqlRule
    from federator.query.queries import Query
    from federator.store.types import Handler, StoreType

PROJECT = "federator"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def register_store_types() -> list[StoreType]:
    """Store types: changelog layout and apply logic, on-disk layout (column families), Arrow schema."""


@hookspec
def register_query_types() -> list[type[Query]]:
    """Query classes (frozen dataclasses with a unique ``type_name``) that travel between nodes."""


@hookspec
def register_query_handlers() -> list[tuple[str, type[Query], Handler]]:
    """(store type name, query class, handler): teach a store type, built-in or not, a query."""


@hookspec
def register_formats() -> list[Format]:
    """Key or value formats, by name."""


@hookspec
def register_sql_rules() -> list[SqlRule]:
    """Rules that turn a SQL shape into the plugin's queries; tried before the built-in planning."""
