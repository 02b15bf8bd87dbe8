"""The plugin API in one process: what each hook registers, and the plugins it leaves out."""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import ClassVar

import pyarrow as pa
import pytest

from federator.catalog import DefinitionError, StoreDefinition
from federator.formats import Format
from federator.plugin import PluginsFailed, hookimpl, load_plugins
from federator.query import KeyQuery, RangeQuery
from federator.query.queries import Query
from federator.store import ChangelogRecord, Shard
from federator.store.kv import KeyValueStoreType
from tests.registry import REGISTRY


class Upper(Format):
    """A value format that stores text upper-cased (a stand-in for Avro and the like)."""

    name = "upper_text"
    arrow_type = pa.string()

    def serialize(self, value):
        return str(value).upper().encode()

    def deserialize(self, data):
        return data.decode()

    def decode_many(self, data):
        return pa.array([d.decode() for d in data], pa.string())

    def coerce(self, value):
        return str(value)


@dataclass(frozen=True)
class CountQuery(Query):
    type_name: ClassVar[str] = "TestCountQuery"


def count(view, q):
    return pa.record_batch({"n": pa.array([sum(1 for _ in view.scan())], pa.int64())})


def test_formats_query_types_and_handlers_from_a_plugin(tmp_path) -> None:
    plugin = types.SimpleNamespace(
        register_formats=hookimpl(lambda: [Upper()]),
        register_query_types=hookimpl(lambda: [CountQuery]),
        register_query_handlers=hookimpl(lambda: [("kv", CountQuery, count)]),
    )
    registry = load_plugins({"test_upper": plugin})
    (info,) = [p for p in registry.plugins if p.name == "test_upper"]
    assert info.provides == ("query type TestCountQuery", "format upper_text", "TestCountQuery on kv stores")
    assert registry.provider_of("query type TestCountQuery") == "test_upper"
    assert registry.format("upper_text").serialize("abc") == b"ABC"
    defn = StoreDefinition.from_dict({"name": "s", "type": "kv", "topic": "t", "partitions": 1,
                                      "key": {"format": "string"}, "value": {"format": "upper_text"}}, registry)
    shard = Shard(tmp_path / "s", defn, 0)
    shard.apply([ChangelogRecord(b"a", defn.value.serialize("x"), 0, 1), ChangelogRecord(b"b", b"Y", 1, 1)])
    batch, _ = shard.query(RangeQuery())
    assert batch.column("value").to_pylist() == ["X", "Y"]
    # the query travels as JSON and finds its class and handler on the other side
    q = registry.query_from_dict(CountQuery().to_dict())
    assert shard.query(q)[0].column("n").to_pylist() == [2]
    # the plugin taught its own registry's kv type, not the class, nor any other registry's
    assert CountQuery not in KeyValueStoreType.handlers
    assert CountQuery not in REGISTRY.store_types["kv"].handlers
    with pytest.raises(DefinitionError, match="upper_text"):
        StoreDefinition.from_dict(defn.to_dict(), REGISTRY)


def test_the_built_in_plugin_goes_through_the_hooks() -> None:
    registry = load_plugins(names=())  # no installed plugin: the built-in one alone
    (builtin,) = registry.plugins
    assert builtin.builtin and builtin.name == "federator"
    assert list(registry.store_types) == ["kv", "window", "session", "versioned"]
    assert {"string", "bytes", "long", "int", "double", "json"} == set(registry.formats)
    assert "store type kv" in builtin.provides and "query type KeyQuery" in builtin.provides
    assert registry.sql_rules == () and registry.failures == ()
    assert registry.provider_of("query type KeyQuery") is None  # nothing to install for a built-in


def failed(registry, name: str) -> str:
    assert not any(p.name == name for p in registry.plugins)
    (failure,) = [f for f in registry.failures if f.name == name]
    return failure.error


def test_a_misspelled_hook_is_refused() -> None:
    plugin = types.SimpleNamespace(register_store_typez=hookimpl(lambda: []))
    registry = load_plugins({"typo": plugin})
    assert "PluginValidationError" in failed(registry, "typo") and "register_store_typez" in failed(registry, "typo")


def test_a_format_name_is_registered_once() -> None:
    class Again(Upper):
        pass

    registry = load_plugins({"first": types.SimpleNamespace(register_formats=hookimpl(lambda: [Upper()])),
                             "again": types.SimpleNamespace(register_formats=hookimpl(lambda: [Again()]))})
    assert "format upper_text is already registered by the plugin 'first'" in failed(registry, "again")
    assert type(registry.formats["upper_text"]) is Upper


def test_a_plugin_whose_hook_raises_is_left_out_whole() -> None:
    def broken() -> list:
        raise ImportError("no module named 'avro'")

    plugin = types.SimpleNamespace(register_query_types=hookimpl(lambda: [CountQuery]),
                                   register_formats=hookimpl(broken))
    registry = load_plugins({"broken": plugin})
    assert failed(registry, "broken") == "register_formats() raised ImportError: no module named 'avro'"
    assert "TestCountQuery" not in registry.query_types  # nothing of it, not even what worked
    assert "leaderboard" in registry.store_types  # the others load as ever


def test_a_handler_for_a_store_type_nobody_provides_leaves_its_plugin_out() -> None:
    plugin = types.SimpleNamespace(register_query_types=hookimpl(lambda: [CountQuery]),
                                   register_query_handlers=hookimpl(lambda: [("nosuch", CountQuery, count)]))
    registry = load_plugins({"lost": plugin})
    assert "store type 'nosuch', which no plugin provides" in failed(registry, "lost")
    assert "TestCountQuery" not in registry.query_types


def test_a_plugin_teaches_a_query_to_a_store_type_a_later_plugin_provides() -> None:
    class Counted(KeyValueStoreType):
        name = "counted"

    teacher = types.SimpleNamespace(register_query_types=hookimpl(lambda: [CountQuery]),
                                    register_query_handlers=hookimpl(lambda: [("counted", CountQuery, count)]))
    owner = types.SimpleNamespace(register_store_types=hookimpl(lambda: [Counted()]))
    registry = load_plugins({"teacher": teacher, "owner": owner}, names=())
    assert registry.failures == ()
    assert registry.store_types["counted"].answers(CountQuery, KeyQuery)


def test_a_node_with_a_failed_plugin_stops_unless_told_to_warn(tmp_path) -> None:
    from federator.node.node import Node, NodeConfig

    registry = load_plugins({"typo": types.SimpleNamespace(register_store_typez=hookimpl(lambda: []))})
    config = NodeConfig("127.0.0.1:1", "app", "127.0.0.1:0", tmp_path / "n", node_id="n")
    with pytest.raises(PluginsFailed) as e:
        Node(config, registry)
    assert "plugin 'typo'" in str(e.value) and "--plugin-errors warn" in str(e.value)
    config.plugin_errors = "warn"
    node = Node(config, registry)
    assert node.registry is registry


def test_the_plugins_command_lists_the_installed_plugins() -> None:
    import os
    import subprocess

    from tests.conftest import federator_cmd

    out = subprocess.run(federator_cmd("plugins"), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "leaderboard" in out.stdout and "store type leaderboard" in out.stdout
    assert "SQL rule prefix_scan.like" in out.stdout
    assert "built in: store type kv" in out.stdout
    none = subprocess.run(federator_cmd("plugins"), capture_output=True, text=True, timeout=60,
                          env={**os.environ, "FEDERATOR_PLUGINS": ""})
    assert none.returncode == 0 and "no plugins installed" in none.stdout


def test_the_plugins_command_names_a_plugin_that_fails_to_load(tmp_path) -> None:
    """An installed plugin whose import fails: listed as failed, and the command exits 1."""
    import os
    import subprocess

    from tests.conftest import federator_cmd

    dist = tmp_path / "federator_broken-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: federator-broken\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[federator.plugins]\nbroken = federator_broken_plugin\n")
    (tmp_path / "federator_broken_plugin.py").write_text("raise ImportError('it needs avro')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    out = subprocess.run(federator_cmd("plugins"), capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "broken  FAILED to load (federator_broken_plugin): ImportError: it needs avro" in out.stdout
    assert "leaderboard" in out.stdout  # the others still load


def test_a_plugin_store_type_is_planned_by_what_it_answers_not_by_its_name() -> None:
    """A type built on window or kv, under another name, gets their definitions and plans."""
    import sqlglot

    from federator.plan.keys import answers_key_queries, plan_store_queries
    from federator.query import WindowKeyQuery, WindowRangeQuery
    from federator.store.window import WindowStoreType

    class Hourly(WindowStoreType):
        name = "hourly"

    class Plain(KeyValueStoreType):
        name = "plain"

    plugin = types.SimpleNamespace(register_store_types=hookimpl(lambda: [Hourly(), Plain()]))
    registry = load_plugins({"types": plugin}, names=())
    hourly = StoreDefinition.from_dict({"name": "h", "type": "hourly", "topic": "t", "partitions": 4,
                                        "key": {"format": "string"}, "value": {"format": "long"},
                                        "window_size_ms": 3_600_000}, registry)
    assert hourly.windowed and hourly.store_type.changelog_layout == "window"
    assert not answers_key_queries(hourly)
    where = sqlglot.parse_one("key = 'a' AND window_start >= 0", read="duckdb")
    assert [type(sq.query) for sq in plan_store_queries(hourly, where, [])] == [WindowKeyQuery]
    assert [sq.query for sq in plan_store_queries(hourly, None, [])] == [WindowRangeQuery()]
    with pytest.raises(DefinitionError, match="window_size_ms"):
        StoreDefinition.from_dict({**hourly.to_dict(), "window_size_ms": None}, registry)
    plain = StoreDefinition.from_dict({"name": "p", "type": "plain", "topic": "t", "partitions": 4,
                                       "key": {"format": "string"}, "value": {"format": "long"}}, registry)
    assert answers_key_queries(plain) and not plain.windowed
    assert [type(sq.query) for sq in plan_store_queries(plain, sqlglot.parse_one("key = 'a'"), [])] == [KeyQuery]
