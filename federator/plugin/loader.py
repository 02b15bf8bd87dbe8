"""Loading plugins into a Registry: the built-in plugin, then the entry points of the group
``federator.plugins``, then any plugin objects a caller hands over (embedding, tests).

Each call builds a new registry and keeps nothing. A plugin that cannot be loaded (its import
fails, a hook raises, it misspells a hook, it registers a name another plugin has, it adds a
handler to a store type nobody provides) is left out whole and named in
``Registry.failures``: whether that stops the process is the caller's decision (the node's
``--plugin-errors``). Only the built-in plugin failing raises, since nothing works without it.

``FEDERATOR_PLUGINS`` limits which entry points load: unset loads all, a comma-separated list
loads those names, an empty value loads none (the built-in plugin loads regardless).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from importlib import metadata
from types import MappingProxyType
from typing import Any, Callable, Collection, Iterable, Mapping

import pluggy

from federator.formats import Format
from federator.plugin import builtins, hookspecs
from federator.plugin.registry import PluginFailure, PluginInfo, Registry
from federator.plugin.rules import SqlRule
from federator.query.queries import Query
from federator.store.types import Handler, StoreType
from federator.errors import FederatorError

log = logging.getLogger(__name__)

GROUP = "federator.plugins"
ENV = "FEDERATOR_PLUGINS"


class PluginsFailed(FederatorError, RuntimeError):
    """Plugins failed to load where that is fatal (the node's ``--plugin-errors fatal``)."""

    def __init__(self, failures: Iterable[PluginFailure], hint: str = "") -> None:
        self.failures = tuple(failures)
        super().__init__("; ".join(str(f) for f in self.failures) + (f"; {hint}" if hint else ""))


def wanted_from_env() -> set[str] | None:
    """The entry point names ``FEDERATOR_PLUGINS`` allows (None: all)."""
    raw = os.environ.get(ENV)
    if raw is None:
        return None
    return {n.strip() for n in raw.split(",") if n.strip()}


@dataclass
class _Candidate:
    """One plugin on its way into the registry."""

    name: str
    source: str
    obj: Any
    distribution: str | None = None
    version: str | None = None
    builtin: bool = False
    # what its hooks returned
    store_types: list[StoreType] = field(default_factory=list)
    query_types: list[type[Query]] = field(default_factory=list)
    formats: list[Format] = field(default_factory=list)
    handlers: list[tuple[str, type[Query], Handler]] = field(default_factory=list)
    rules: list[SqlRule] = field(default_factory=list)


class _Rejected(Exception):
    """Why a plugin is left out (its message goes into the PluginFailure)."""


_FROM_ENV: Any = object()


def load_plugins(extra: Mapping[str, Any] | None = None, names: Collection[str] | None = _FROM_ENV) -> Registry:
    """A new registry: the built-in plugin, the entry points ``names`` allows (default: as
    ``FEDERATOR_PLUGINS`` says; None: all), then ``extra`` (name -> plugin object)."""
    wanted = wanted_from_env() if names is _FROM_ENV else (None if names is None else set(names))
    failures: list[PluginFailure] = []
    candidates = [_Candidate(builtins.NAME, builtins.__name__, builtins, "federator", _version(), builtin=True)]
    for ep in metadata.entry_points(group=GROUP):
        if wanted is not None and ep.name not in wanted:
            continue
        if any(c.name == ep.name for c in candidates):
            continue  # one distribution seen twice on sys.path: the first wins, as for imports
        try:
            obj = ep.load()
        except Exception as e:  # noqa: BLE001 - a broken plugin is named, not a crash here
            failures.append(PluginFailure(ep.name, ep.value, f"{type(e).__name__}: {e}"))
            continue
        dist = ep.dist
        candidates.append(_Candidate(ep.name, ep.value, obj, dist.metadata["Name"] if dist else None,
                                     dist.version if dist else None))
    for name, obj in (extra or {}).items():
        candidates.append(_Candidate(name, repr(obj), obj))

    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    loaded: list[_Candidate] = []
    for c in candidates:
        try:
            _register_hooks(pm, c)
            _collect(pm, c)
        except _Rejected as e:
            failures.append(PluginFailure(c.name, c.source, str(e)))
            continue
        loaded.append(c)
    registry = _build(loaded, failures)
    for f in registry.failures:
        if f.name == builtins.NAME:
            raise PluginsFailed([f], "the built-in plugin is part of Federator: reinstall it")
        log.warning("%s", f)
    return registry


def _version() -> str | None:
    from federator import __version__

    return __version__


def _register_hooks(pm: pluggy.PluginManager, c: _Candidate) -> None:
    try:
        pm.register(c.obj, name=c.name)
    except Exception as e:  # noqa: BLE001 - pluggy's PluginValidationError, or the object registered twice
        raise _Rejected(f"{type(e).__name__}: {e}") from None
    try:
        pm.check_pending()  # a misspelled hook name fails here, loudly, instead of being ignored
    except pluggy.PluginValidationError as e:
        pm.unregister(c.obj)
        raise _Rejected(f"{type(e).__name__}: {e}") from None


def _collect(pm: pluggy.PluginManager, c: _Candidate) -> None:
    """Call each of the plugin's own hooks (not the other plugins'), checking what comes back."""
    try:
        c.store_types = _returned(pm, c, "register_store_types", lambda x: isinstance(x, StoreType),
                                  "StoreType instances")
        c.query_types = _returned(pm, c, "register_query_types",
                                  lambda x: isinstance(x, type) and issubclass(x, Query), "Query subclasses")
        c.formats = _returned(pm, c, "register_formats", lambda x: isinstance(x, Format), "Format instances")
        c.handlers = _returned(pm, c, "register_query_handlers",
                               lambda x: isinstance(x, tuple) and len(x) == 3 and callable(x[2]),
                               "(store type name, query class, handler) tuples")
        c.rules = _returned(pm, c, "register_sql_rules", lambda x: isinstance(x, SqlRule), "SqlRule instances")
    except _Rejected:
        pm.unregister(c.obj)
        raise


def _returned(pm: pluggy.PluginManager, c: _Candidate, hook: str, ok: Callable[[Any], bool], what: str) -> list:
    impl = next((i for i in getattr(pm.hook, hook).get_hookimpls() if i.plugin is c.obj), None)
    if impl is None:
        return []
    try:
        items = list(impl.function() or [])
    except Exception as e:  # noqa: BLE001 - the plugin's own code failed: name it, not the node
        raise _Rejected(f"{hook}() raised {type(e).__name__}: {e}") from None
    bad = [x for x in items if not ok(x)]
    if bad:
        raise _Rejected(f"{hook}() must return {what}, got {bad[0]!r}")
    return items


def _build(candidates: list[_Candidate], failures: list[PluginFailure]) -> Registry:
    """The registry of ``candidates`` in order, leaving out (into ``failures``) any that clash
    with one before it. Handlers come last, once every plugin's store and query types are in:
    a plugin may teach a query to a store type that a later plugin provides."""
    while True:
        formats: dict[str, Format] = {}
        store_types: dict[str, StoreType] = {}
        query_types: dict[str, type[Query]] = {}
        rules: dict[str, SqlRule] = {}
        owner: dict[str, str] = {}  # "store type kv" -> the plugin that registered it
        kept: list[_Candidate] = []
        for c in candidates:
            try:
                mine = _names(c)
                for what in mine:
                    if what in owner:
                        raise _Rejected(f"{what} is already registered by the plugin {owner[what]!r}")
            except _Rejected as e:
                failures.append(PluginFailure(c.name, c.source, str(e)))
                continue
            for what in mine:
                owner[what] = c.name
            store_types.update((st.name, st) for st in c.store_types)
            query_types.update((q.type_name, q) for q in c.query_types)
            formats.update((f.name, f) for f in c.formats)
            rules.update((r.name, r) for r in c.rules)
            kept.append(c)
        extra: dict[str, dict[type[Query], Handler]] = {}
        rejected = None
        for c in kept:
            for store_type, query_cls, handler in c.handlers:
                if store_type not in store_types:
                    rejected = (c, f"it adds {query_cls.__name__} to store type {store_type!r}, which no plugin provides")
                elif query_types.get(getattr(query_cls, "type_name", None)) is not query_cls:
                    rejected = (c, f"it adds a handler for {query_cls!r}, which is not a registered query type")
                if rejected:
                    break
                extra.setdefault(store_type, {})[query_cls] = handler
            if rejected:
                break
        if rejected is not None:  # leave that plugin out and build again without it
            c, why = rejected
            failures.append(PluginFailure(c.name, c.source, why))
            candidates = [k for k in kept if k is not c]
            continue
        for name, handlers in extra.items():
            store_types[name] = store_types[name].with_handlers(handlers)
        # read-only views: whoever holds the registry reads it, nobody registers into it later
        return Registry(
            formats=MappingProxyType(formats), store_types=MappingProxyType(store_types),
            query_types=MappingProxyType(query_types), sql_rules=tuple(rules.values()),
            plugins=tuple(PluginInfo(c.name, c.distribution, c.version, tuple(_provides(c)), c.builtin) for c in kept),
            failures=tuple(failures),
            providers=MappingProxyType({what: c.name for c in kept if not c.builtin for what in _provides(c)}),
        )


def _names(c: _Candidate) -> list[str]:
    """The names the plugin claims, each claimable by one plugin; also checks that its own don't repeat."""
    names = [*(f"store type {st.name}" for st in c.store_types), *(f"query type {q.type_name}" for q in c.query_types),
             *(f"format {f.name}" for f in c.formats), *(f"SQL rule {r.name}" for r in c.rules)]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise _Rejected(f"it registers {repeated[0]} twice")
    return names


def _provides(c: _Candidate) -> list[str]:
    return [*(f"store type {st.name}" for st in c.store_types), *(f"query type {q.type_name}" for q in c.query_types),
            *(f"format {f.name}" for f in c.formats),
            *(f"{q.type_name} on {st} stores" for st, q, _ in c.handlers), *(f"SQL rule {r.name}" for r in c.rules)]
