"""The registry tests build definitions, shards and apps with: one per test process, loaded the
way a node loads its own (the built-in plugin, then the installed ones)."""

from federator.plugin import load_plugins

REGISTRY = load_plugins()
