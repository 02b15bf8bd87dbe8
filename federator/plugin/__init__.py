"""The plugin API: hooks discovered from the entry-point group ``federator.plugins``.

A plugin is a module (or object) with functions marked ``@hookimpl`` whose names are
the hooks in ``hookspecs.py``. ``load_plugins()`` loads the built-in plugin and the
installed ones into a new ``Registry``. See docs/plugins.md for a complete minimal plugin.
"""

from federator.plugin.hookspecs import hookimpl
from federator.plugin.loader import PluginsFailed, load_plugins
from federator.plugin.registry import PluginFailure, PluginInfo, Registry
from federator.plugin.rules import RulePlan, SqlRule

__all__ = [
    "PluginFailure",
    "PluginInfo",
    "PluginsFailed",
    "Registry",
    "RulePlan",
    "SqlRule",
    "hookimpl",
    "load_plugins",
]
