"""The plugin API in one process: what each hook registers, and mistakes it refuses."""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import ClassVar

import pluggy
import pyarrow as pa
import pytest

from federator.catalog import StoreDefinition
from federator.formats import Format, FormatError, get_format
from federator.plugin import hookimpl
from federator.plugin.manager import installed_plugins, provider_of, register
from federator.query import RangeQuery
from federator.query.queries import Query, query_from_dict
from federator.store import ChangelogRecord, Shard


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
    info = register(plugin, "test_upper")
    assert info.provides == ("query type TestCountQuery", "format upper_text", "TestCountQuery on kv stores")
    assert provider_of("query type TestCountQuery") == "test_upper"
    assert any(p.name == "test_upper" for p in installed_plugins())
    assert get_format("upper_text").serialize("abc") == b"ABC"
    defn = StoreDefinition.from_dict({"name": "s", "type": "kv", "topic": "t", "partitions": 1,
                                      "key": {"format": "string"}, "value": {"format": "upper_text"}})
    defn.validate()
    shard = Shard(tmp_path / "s", defn, 0)
    shard.apply([ChangelogRecord(b"a", defn.value.serialize("x"), 0, 1), ChangelogRecord(b"b", b"Y", 1, 1)])
    batch, _ = shard.query(RangeQuery())
    assert batch.column("value").to_pylist() == ["X", "Y"]
    # the query travels as JSON and finds its class and handler on the other side
    q = query_from_dict(CountQuery().to_dict())
    assert shard.query(q)[0].column("n").to_pylist() == [2]


def test_a_misspelled_hook_is_refused() -> None:
    plugin = types.SimpleNamespace(register_store_typez=hookimpl(lambda: []))
    with pytest.raises(pluggy.PluginValidationError, match="register_store_typez"):
        register(plugin, "typo")
    assert not any(p.name == "typo" for p in installed_plugins())


def test_a_format_name_is_registered_once() -> None:
    class Again(Upper):
        pass

    with pytest.raises(FormatError, match="already registered"):
        register(types.SimpleNamespace(register_formats=hookimpl(lambda: [Again()])), "again")
    assert not any(p.name == "again" for p in installed_plugins())


def test_the_plugins_command_lists_the_installed_plugins() -> None:
    import os
    import subprocess

    from tests.conftest import federator_cmd

    out = subprocess.run(federator_cmd("plugins"), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "leaderboard" in out.stdout and "store type leaderboard" in out.stdout
    assert "SQL rule prefix_scan.like" in out.stdout
    none = subprocess.run(federator_cmd("plugins"), capture_output=True, text=True, timeout=60,
                          env={**os.environ, "FEDERATOR_PLUGINS": ""})
    assert none.returncode == 0 and "no plugins installed" in none.stdout
