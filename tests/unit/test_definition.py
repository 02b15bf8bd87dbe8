"""StoreDefinition: validation names the bad field, JSON round trips, differences()."""

from __future__ import annotations

import copy
import json
from typing import Any

import pyarrow as pa
import pytest

from federator.catalog import DefinitionError, StoreDefinition, parse_value_fields
from federator.formats import TIMESTAMP, JsonFormat
from tests.registry import REGISTRY


def base(**changes: Any) -> dict[str, Any]:
    d: dict[str, Any] = {
        "name": "orders",
        "type": "kv",
        "topic": "app-orders-changelog",
        "partitions": 4,
        "key": {"name": "id", "format": "string"},
        "value": {"format": "long", "name": "total"},
    }
    d.update(changes)
    return d


def json_value(*fields: tuple[str, str]) -> dict[str, Any]:
    return {"format": "json", "fields": [{"name": n, "type": t} for n, t in fields]}


def window(**changes: Any) -> dict[str, Any]:
    return base(type="window", window_size_ms=60_000, **changes)


def error(d: Any) -> str:
    with pytest.raises(DefinitionError) as e:
        StoreDefinition.from_dict(d, REGISTRY)
    return str(e.value)


# ---- valid definitions --------------------------------------------------------------------------


def test_valid_kv_definition() -> None:
    defn = StoreDefinition.from_dict(base(), REGISTRY)
    assert (defn.name, defn.type, defn.topic, defn.partitions) == ("orders", "kv", "app-orders-changelog", 4)
    assert (defn.key_name, defn.key_format, defn.value_name, defn.value_format) == ("id", "string", "total", "long")
    assert defn.key.name == "string" and defn.value.name == "long"
    assert defn.value_columns == ["total"]
    assert not defn.windowed
    assert defn.arrow_schema() == pa.schema(
        [pa.field("id", pa.string()), pa.field("total", pa.int64()), pa.field("rowtime", TIMESTAMP)]
    )


def test_key_and_value_names_default() -> None:
    d = base(key={"format": "long"}, value={"format": "string"})
    defn = StoreDefinition.from_dict(d, REGISTRY)
    assert defn.key_name == "key" and defn.value_name == "value"


def test_valid_json_window_definition() -> None:
    defn = StoreDefinition.from_dict(window(value=json_value(("score", "long"), ("seen", "timestamp"))), REGISTRY)
    assert defn.windowed and defn.window_size_ms == 60_000
    assert defn.value_fields == (("score", "long"), ("seen", "timestamp"))
    assert defn.value_columns == ["score", "seen"]
    assert isinstance(defn.value, JsonFormat)
    assert defn.arrow_schema().names == ["id", "window_start", "window_end", "score", "seen", "rowtime"]


def test_session_definition_is_windowed() -> None:
    defn = StoreDefinition.from_dict(base(type="session"), REGISTRY)
    assert defn.windowed
    assert defn.arrow_schema().names == ["id", "window_start", "window_end", "total", "rowtime"]


# ---- each bad field gives a DefinitionError naming it -----------------------------------------


def test_definition_error_is_value_error() -> None:
    assert issubclass(DefinitionError, ValueError)


def test_not_an_object() -> None:
    assert "JSON object" in error(["orders"])


@pytest.mark.parametrize("name", [None, "", "1abc", "has space", "dash-ed", "x" * 201, 5, "é"])
def test_bad_name(name: Any) -> None:
    assert "field 'name'" in error(base(name=name))


def test_name_limits() -> None:
    assert StoreDefinition.from_dict(base(name="_" + "x" * 199), REGISTRY).name == "_" + "x" * 199


@pytest.mark.parametrize("typ", [None, "", "KV", "table", 3])
def test_bad_type(typ: Any) -> None:
    msg = error(base(type=typ))
    assert "field 'type'" in msg
    assert "store 'orders'" in msg
    assert "kv" in msg  # and the known types are listed


@pytest.mark.parametrize("topic", [None, "", "has space", "bad/topic", "x" * 250, 7])
def test_bad_topic(topic: Any) -> None:
    assert "field 'topic'" in error(base(topic=topic))


def test_topic_limits() -> None:
    assert StoreDefinition.from_dict(base(topic="a._-Z9" + "x" * 243), REGISTRY).topic.startswith("a._-Z9")


@pytest.mark.parametrize("partitions", [None, 0, -1, "4", 1.5, True, False])
def test_bad_partitions(partitions: Any) -> None:
    assert "field 'partitions'" in error(base(partitions=partitions))


@pytest.mark.parametrize("key", [{"name": "id"}, {"name": "id", "format": "avro"}, {"name": "id", "format": "json"}])
def test_bad_key_format(key: dict) -> None:
    assert "field 'key.format'" in error(base(key=key))


def test_key_not_an_object() -> None:
    assert "field 'key'" in error(base(key="string"))


def test_value_not_an_object() -> None:
    assert "field 'value'" in error(base(value="string"))


@pytest.mark.parametrize("value", [{"name": "v"}, {"name": "v", "format": "avro"}, {"name": "v", "format": 1}])
def test_bad_value_format(value: dict) -> None:
    assert "field 'value.format'" in error(base(value=value))


@pytest.mark.parametrize(
    "value",
    [
        {"format": "json"},
        {"format": "json", "fields": []},
        {"format": "json", "fields": ["score:long"]},
        {"format": "json", "fields": [{"name": "score"}]},
        {"format": "json", "fields": [{"type": "long"}]},
        {"format": "json", "fields": 5},
        {"format": "json", "fields": [{"name": "score", "type": "decimal"}]},
        {"format": "long", "name": "v", "fields": [{"name": "score", "type": "long"}]},
    ],
)
def test_bad_value_fields(value: dict) -> None:
    assert "field 'value.fields'" in error(base(value=value))


def test_unknown_json_field_type_is_named() -> None:
    msg = error(base(value=json_value(("score", "decimal"))))
    assert "'score'" in msg and "'decimal'" in msg


@pytest.mark.parametrize("size", [None, 0, -5, "60000", True, 1.5])
def test_window_store_needs_positive_window_size(size: Any) -> None:
    d = window()
    d["window_size_ms"] = size
    assert "field 'window_size_ms'" in error(d)


@pytest.mark.parametrize("typ", ["kv", "session"])
def test_window_size_only_for_window_stores(typ: str) -> None:
    assert "field 'window_size_ms'" in error(base(type=typ, window_size_ms=1000))


@pytest.mark.parametrize("reserved", ["window_start", "window_end", "rowtime", "ROWTIME", "Window_Start"])
@pytest.mark.parametrize("where", ["key", "value", "json"])
def test_reserved_column_names(reserved: str, where: str) -> None:
    if where == "key":
        d = base(key={"name": reserved, "format": "string"})
    elif where == "value":
        d = base(value={"name": reserved, "format": "long"})
    else:
        d = base(value=json_value(("ok", "long"), (reserved, "string")))
    msg = error(d)
    assert repr(reserved) in msg and "reserved" in msg


@pytest.mark.parametrize("col", ["has space", "1x", ""])
def test_invalid_column_names(col: str) -> None:
    assert "column name" in error(base(value={"name": col, "format": "long"}))
    assert "column name" in error(base(value=json_value((col, "long"))))


@pytest.mark.parametrize(
    "d",
    [
        base(key={"name": "id", "format": "string"}, value={"name": "id", "format": "long"}),
        base(key={"name": "id", "format": "string"}, value={"name": "ID", "format": "long"}),
        base(value=json_value(("score", "long"), ("score", "int"))),
        base(key={"name": "score", "format": "string"}, value=json_value(("Score", "long"))),
    ],
)
def test_duplicate_column_names(d: dict) -> None:
    msg = error(d)
    assert "'id'" in msg or "'score'" in msg
    assert "twice" in msg


def test_unknown_top_level_field_is_named() -> None:
    msg = error(base(windowsize=5))
    assert "'windowsize'" in msg


def test_from_json_rejects_bad_json() -> None:
    with pytest.raises(DefinitionError, match="not valid JSON"):
        StoreDefinition.from_json(b"{nope", REGISTRY)


# ---- JSON round trip --------------------------------------------------------------------------

ROUND_TRIP = [
    base(),
    base(key={"name": "k", "format": "long"}, value={"name": "v", "format": "bytes"}),
    window(value=json_value(("a", "string"), ("b", "long"), ("c", "int"), ("d", "double"), ("e", "boolean"), ("f", "timestamp"))),
    base(type="session", key={"name": "user", "format": "double"}, value={"name": "clicks", "format": "int"}),
    base(options={"retention_ms": 1000, "nested": {"a": [1, 2]}}),
]


@pytest.mark.parametrize("d", ROUND_TRIP)
def test_json_round_trip(d: dict) -> None:
    defn = StoreDefinition.from_dict(copy.deepcopy(d), REGISTRY)
    again = StoreDefinition.from_json(defn.to_json(), REGISTRY)
    assert again == defn
    assert again.to_json() == defn.to_json()
    assert again.to_dict() == defn.to_dict()
    assert again.arrow_schema() == defn.arrow_schema()
    assert defn.differences(again) == []
    # to_dict is the input, with defaults filled in
    assert json.loads(defn.to_json()) == json.loads(json.dumps(defn.to_dict()))
    assert StoreDefinition.from_dict(defn.to_dict(), REGISTRY) == defn


def test_to_json_is_canonical() -> None:
    a = StoreDefinition.from_dict(base(), REGISTRY)
    shuffled = dict(reversed(list(base().items())))
    b = StoreDefinition.from_dict(shuffled, REGISTRY)
    assert a.to_json() == b.to_json()


def test_to_dict_shape() -> None:
    defn = StoreDefinition.from_dict(window(value=json_value(("score", "long"))), REGISTRY)
    assert defn.to_dict() == {
        "name": "orders",
        "type": "window",
        "topic": "app-orders-changelog",
        "partitions": 4,
        "key": {"name": "id", "format": "string"},
        "value": {"format": "json", "fields": [{"name": "score", "type": "long"}]},
        "window_size_ms": 60_000,
    }


# ---- differences ----------------------------------------------------------------------------------


def test_differences_lists_each_differing_field() -> None:
    a = StoreDefinition.from_dict(base(), REGISTRY)
    b = StoreDefinition.from_dict(base(partitions=8, key={"name": "order_id", "format": "string"}), REGISTRY)
    diffs = a.differences(b)
    assert diffs == ["key.name: 'id' vs 'order_id'", "partitions: 4 vs 8"]
    assert b.differences(a) == ["key.name: 'order_id' vs 'id'", "partitions: 8 vs 4"]


def test_differences_with_fields_only_one_side_has() -> None:
    a = StoreDefinition.from_dict(base(), REGISTRY)
    b = StoreDefinition.from_dict(window(value=json_value(("score", "long"))), REGISTRY)
    diffs = a.differences(b)
    fields = [d.split(":")[0] for d in diffs]
    assert fields == ["type", "value.fields", "value.format", "value.name", "window_size_ms"]
    assert "window_size_ms: None vs 60000" in diffs
    assert "value.format: 'long' vs 'json'" in diffs


def test_no_differences_with_itself() -> None:
    a = StoreDefinition.from_dict(base(), REGISTRY)
    assert a.differences(StoreDefinition.from_dict(base(), REGISTRY)) == []


# ---- parse_value_fields ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("score:long", (("score", "long"),)),
        ("score:long,name:string", (("score", "long"), ("name", "string"))),
        (" score : long , name:string ,", (("score", "long"), ("name", "string"))),
        ("a:timestamp,,b:boolean", (("a", "timestamp"), ("b", "boolean"))),
    ],
)
def test_parse_value_fields(spec: str, expected: tuple) -> None:
    assert parse_value_fields(spec) == expected


@pytest.mark.parametrize("spec", ["score", "score:", ":long", " : ", "a:long,b"])
def test_parse_value_fields_rejects_malformed_pairs(spec: str) -> None:
    with pytest.raises(DefinitionError, match="is not name:type"):
        parse_value_fields(spec)


@pytest.mark.parametrize("spec", ["", " ", ",,"])
def test_parse_value_fields_needs_one_pair(spec: str) -> None:
    with pytest.raises(DefinitionError, match="at least one"):
        parse_value_fields(spec)


def test_parsed_fields_build_a_definition() -> None:
    fields = parse_value_fields("score:long,seen:timestamp")
    d = base(value={"format": "json", "fields": [{"name": n, "type": t} for n, t in fields]})
    assert StoreDefinition.from_dict(d, REGISTRY).value_columns == ["score", "seen"]
