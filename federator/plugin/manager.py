"""Finding plugins (entry points, group ``federator.plugins``) and registering what they provide.

Loaded once per process, on first need: the first store type, query type, format or
SQL rule looked up. ``FEDERATOR_PLUGINS`` limits which entry points load: unset loads
all, a comma-separated list loads those names, an empty value loads none.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from importlib import metadata
from typing import TYPE_CHECKING, Any

import pluggy

from federator.plugin import hookspecs

if TYPE_CHECKING:
    from federator.plugin.rules import SqlRule

GROUP = "federator.plugins"
ENV = "FEDERATOR_PLUGINS"


@dataclass(frozen=True)
class PluginInfo:
    name: str  # the entry point's name
    distribution: str | None
    version: str | None
    provides: tuple[str, ...]  # "store type leaderboard", "query type TopKQuery", ...


class _State:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.loaded = False
        self.pm: pluggy.PluginManager | None = None
        self.rules: list[SqlRule] = []
        self.providers: dict[str, str] = {}  # "query type X" / "store type Y" / ... -> plugin name
        self.plugins: list[PluginInfo] = []


_state = _State()


def _wanted() -> set[str] | None:
    raw = os.environ.get(ENV)
    if raw is None:
        return None
    return {n.strip() for n in raw.split(",") if n.strip()}


def load_plugins() -> None:
    """Load every installed plugin and register what it provides (idempotent, thread-safe)."""
    if _state.loaded:
        return
    with _state.lock:
        if _state.loaded:
            return
        _state.loaded = True  # set first: registering below looks things up, which calls back here
        from federator.store.types import _ensure_builtins

        _ensure_builtins()
        pm = pluggy.PluginManager(hookspecs.PROJECT)
        pm.add_hookspecs(hookspecs)
        wanted = _wanted()
        dists: dict[str, tuple[str | None, str | None]] = {}
        for ep in metadata.entry_points(group=GROUP):
            if wanted is not None and ep.name not in wanted:
                continue
            if pm.get_plugin(ep.name) is not None:
                continue
            try:
                plugin = ep.load()
            except Exception as e:  # a broken plugin must not take the node down; say which and why
                raise RuntimeError(
                    f"plugin {ep.name!r} ({ep.value}) failed to load: {e}; "
                    f"fix or uninstall it, or leave it out with {ENV}"
                ) from e
            pm.register(plugin, name=ep.name)
            dist = ep.dist
            dists[ep.name] = (dist.metadata["Name"] if dist else None, dist.version if dist else None)
        pm.check_pending()  # a misspelled hook name fails here, loudly
        _state.pm = pm
        provided: dict[str, list[str]] = {}
        for plugin_name, plugin in pm.list_name_plugin():
            provided[plugin_name] = _register_from(pm, plugin_name, plugin)
        _state.plugins = [
            PluginInfo(n, *dists.get(n, (None, None)), provides=tuple(p)) for n, p in provided.items()
        ]


def register(plugin: Any, name: str) -> PluginInfo:
    """Register a plugin object in this process without an entry point (embedding, tests)."""
    load_plugins()
    with _state.lock:
        pm = _state.pm
        assert pm is not None
        pm.register(plugin, name=name)
        try:
            pm.check_pending()
            provides = _register_from(pm, name, plugin)
        except Exception:
            pm.unregister(plugin)
            raise
        info = PluginInfo(name, None, None, tuple(provides))
        _state.plugins.append(info)
        return info


def _call(pm: pluggy.PluginManager, plugin: Any, hook: str) -> list[Any]:
    impl = next((i for i in getattr(pm.hook, hook).get_hookimpls() if i.plugin is plugin), None)
    if impl is None:
        return []
    return list(impl.function() or [])


def _register_from(pm: pluggy.PluginManager, name: str, plugin: Any) -> list[str]:
    from federator.formats import register_format
    from federator.query.queries import register_query_type
    from federator.store.types import get_store_type, register_store_type

    provides: list[str] = []

    def note(what: str) -> None:
        provides.append(what)
        _state.providers.setdefault(what, name)

    # Order matters: handlers may name this plugin's own store and query types.
    for st in _call(pm, plugin, "register_store_types"):
        register_store_type(st)
        note(f"store type {st.name}")
    for q in _call(pm, plugin, "register_query_types"):
        register_query_type(q)
        note(f"query type {q.type_name}")
    for fmt in _call(pm, plugin, "register_formats"):
        register_format(fmt)
        note(f"format {fmt.name}")
    for store_type, query_cls, handler in _call(pm, plugin, "register_query_handlers"):
        get_store_type(store_type).add_handler(query_cls, handler)
        note(f"{query_cls.type_name} on {store_type} stores")
    for rule in _call(pm, plugin, "register_sql_rules"):
        _state.rules.append(rule)
        note(f"SQL rule {rule.name}")
    return provides


def sql_rules() -> list[SqlRule]:
    load_plugins()
    return _state.rules


def installed_plugins() -> list[PluginInfo]:
    load_plugins()
    return list(_state.plugins)


def provider_of(what: str) -> str | None:
    """The plugin that provides e.g. ``"query type TopKQuery"`` in this process, if one does."""
    load_plugins()
    return _state.providers.get(what)
