"""The plugin API: hooks discovered from the entry-point group ``federator.plugins``.

A plugin is a module (or object) with functions marked ``@hookimpl`` whose names are
the hooks in ``hookspecs.py``. See docs/plugins.md for a complete minimal plugin.
"""

from federator.plugin.hookspecs import hookimpl
from federator.plugin.manager import installed_plugins, load_plugins, provider_of
from federator.plugin.rules import RulePlan, SqlRule

__all__ = ["RulePlan", "SqlRule", "hookimpl", "installed_plugins", "load_plugins", "provider_of"]
