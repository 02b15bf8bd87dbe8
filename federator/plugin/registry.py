"""The registry: every format, store type, query type and SQL rule one process knows.

``load_plugins()`` (federator.plugin.loader) builds it once, at start-up, from the built-in
plugin and the installed ones; whoever starts the work owns it (the node, the CLI, the Spark
sink, a test) and passes it down. It is never changed after it is built and no module keeps
one: two registries in one process (say, a test's and a node's) do not see each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from federator.formats import Format, FormatError
from federator.query.queries import Query, query_from_dict
from federator.store.types import StoreType

if TYPE_CHECKING:
    from federator.plugin.rules import SqlRule


@dataclass(frozen=True)
class PluginInfo:
    """A plugin that loaded, and what it registered."""

    name: str  # the entry point's name ("federator" for the built-in plugin)
    distribution: str | None
    version: str | None
    provides: tuple[str, ...]  # "store type leaderboard", "query type TopKQuery", ...
    builtin: bool = False


@dataclass(frozen=True)
class PluginFailure:
    """A plugin that did not load: nothing of it is in the registry."""

    name: str
    source: str  # where it comes from: the entry point's target ("federator_plugins.leaderboard"), or the object
    error: str  # what went wrong, as the log and `federator plugins` print it

    def __str__(self) -> str:
        return f"plugin {self.name!r} ({self.source}) failed to load: {self.error}"


@dataclass(frozen=True)
class Registry:
    formats: Mapping[str, Format]  # by name; a format that takes fields (json) is a template
    store_types: Mapping[str, StoreType]  # by name, each with every handler plugins gave it
    query_types: Mapping[str, type[Query]]  # by type_name: how a query on the wire finds its class
    sql_rules: tuple[SqlRule, ...]  # tried in load order, before the built-in key planning
    plugins: tuple[PluginInfo, ...]  # what loaded, the built-in plugin first
    failures: tuple[PluginFailure, ...] = ()  # what did not (the node's --plugin-errors decides)
    # "query type TopKQuery" -> the plugin (not the built-in one) that provides it
    providers: Mapping[str, str] = field(default_factory=dict)

    def format(self, name: str, fields: Sequence[tuple[str, str]] | None = None) -> Format:
        """The format called ``name``; one that takes fields (json) over ``fields``."""
        fmt = self.formats.get(name) if isinstance(name, str) else None
        if fmt is None:
            raise FormatError(f"unknown format {name!r}; use one of {', '.join(self.formats)}")
        if fmt.takes_fields:
            if not fields:
                raise FormatError(f"{name} format needs declared fields (name:type,...)")
            return fmt.with_fields(fields)
        return fmt

    def store_type(self, name: str) -> StoreType:
        """The store type called ``name``; KeyError saying what there is when none is."""
        st = self.store_types.get(name)
        if st is None:
            raise KeyError(f"unknown store type {name!r}: known are {', '.join(self.store_types)}; "
                           "install the plugin that provides it")
        return st

    def query_from_dict(self, d: Mapping[str, Any]) -> Query:
        """A query as it travels between nodes, its class found among this registry's query types."""
        return query_from_dict(d, self.query_types)

    def provider_of(self, what: str) -> str | None:
        """The plugin that provides e.g. ``"query type TopKQuery"``; None for built-ins and unknowns."""
        return self.providers.get(what)
