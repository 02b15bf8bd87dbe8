"""The Flight SQL messages and catalog results, checked against the spec's wire format and schemas."""

from __future__ import annotations

import datetime as dt
import decimal

import pyarrow as pa
import pytest
from google.protobuf import any_pb2

from federator.catalog.definition import StoreDefinition
from federator.flight import metadata, protocol
from federator.flight.server import parameter_rows
from federator.flight.statements import Expiring
from tests.registry import REGISTRY


def test_messages_encode_with_the_specs_field_numbers() -> None:
    # Tag bytes: (field number << 3) | wire type (0 varint, 2 length-delimited).
    assert protocol.CommandStatementQuery(query="SELECT 1").SerializeToString() == b"\x0a\x08SELECT 1"
    assert protocol.CommandGetTables(table_types=["TABLE"], include_schema=True).SerializeToString() == \
        b"\x22\x05TABLE\x28\x01"
    assert protocol.CommandGetSqlInfo(info=[0, 504]).SerializeToString() == b"\x0a\x03\x00\xf8\x03"  # packed
    assert protocol.ActionCreatePreparedStatementResult(
        prepared_statement_handle=b"h", dataset_schema=b"d", parameter_schema=b"p").SerializeToString() == \
        b"\x0a\x01h\x12\x01d\x1a\x01p"
    assert protocol.DoPutUpdateResult(record_count=-1).SerializeToString() == b"\x08" + b"\xff" * 9 + b"\x01"


def test_optional_fields_keep_presence() -> None:
    # An empty catalog ("objects without a catalog") differs from no catalog filter at all.
    assert protocol.CommandGetDbSchemas().SerializeToString() == b""
    explicit = protocol.parse(protocol.CommandGetDbSchemas, protocol.CommandGetDbSchemas(catalog="").SerializeToString())
    assert explicit.HasField("catalog") and not explicit.HasField("db_schema_filter_pattern")
    assert protocol.DoPutPreparedStatementResult(prepared_statement_handle=b"").SerializeToString() == b"\x0a\x00"


def test_commands_travel_in_any_with_the_spec_type_url() -> None:
    data = protocol.pack(protocol.CommandGetCatalogs())
    wrapper = any_pb2.Any.FromString(data)
    assert wrapper.type_url == "type.googleapis.com/arrow.flight.protocol.sql.CommandGetCatalogs"
    name, msg = protocol.unpack(protocol.pack(protocol.TicketStatementQuery(statement_handle=b"\x01\x02")))
    assert name == "TicketStatementQuery" and msg.statement_handle == b"\x01\x02"
    foreign = any_pb2.Any(type_url="type.googleapis.com/arrow.flight.protocol.sql.CommandGetXdbcTypeInfo")
    assert protocol.unpack(foreign.SerializeToString()) == ("CommandGetXdbcTypeInfo", None)
    with pytest.raises(protocol.ProtocolError):
        protocol.unpack(b"\xff\xff not protobuf")


def test_sql_info_is_a_dense_union_in_request_order() -> None:
    table = metadata.sql_info([3, 0, 99_999, 504])
    assert table.schema == metadata.SQL_INFO_SCHEMA
    assert table.to_pylist() == [{"info_name": 3, "value": True}, {"info_name": 0, "value": "Federator"},
                                 {"info_name": 504, "value": '"'}]
    value = table.column("value").chunk(0)
    assert value.type_codes.to_pylist() == [metadata.BOOL, metadata.STRING, metadata.STRING]
    everything = metadata.sql_info([])
    assert everything.num_rows == len(metadata.sql_info_values())
    assert dict(zip(everything.column("info_name").to_pylist(), everything.column("value").to_pylist()))[510] == \
        ["LENGTH", "LOWER", "SUBSTR", "UPPER"]


def test_filter_patterns() -> None:
    regex = metadata.like_regex("pl_y%")
    assert regex.fullmatch("players") and regex.fullmatch("play") and not regex.fullmatch("pl")
    escaped = metadata.like_regex("a\\_b")
    assert escaped.fullmatch("a_b") and not escaped.fullmatch("axb")
    assert metadata.like_regex("a.c").fullmatch("a.c") and not metadata.like_regex("a.c").fullmatch("abc")


def _stores() -> dict[str, StoreDefinition]:
    out = {}
    for name in ("players", "scores"):
        out[name] = StoreDefinition.from_dict({"name": name, "type": "kv", "partitions": 2, "topic": f"{name}-cl",
                                               "key": {"format": "string"}, "value": {"name": "v", "format": "long"}}, REGISTRY)
    return out


def test_tables_filters_and_schemas() -> None:
    stores = _stores()
    every = metadata.tables(stores, None, None, None, [], False)
    assert every.schema == metadata.TABLES_SCHEMA
    assert [(r["db_schema_name"], r["table_name"], r["table_type"]) for r in every.to_pylist()] == [
        ("information_schema", "columns", "SYSTEM TABLE"), ("information_schema", "tables", "SYSTEM TABLE"),
        ("main", "players", "TABLE"), ("main", "scores", "TABLE")]
    only = metadata.tables(stores, "federator", "ma%", "sc%", ["TABLE"], True)
    assert only.schema == metadata.TABLES_WITH_SCHEMA_SCHEMA and only.column("table_name").to_pylist() == ["scores"]
    schema = pa.ipc.read_schema(pa.py_buffer(only.column("table_schema")[0].as_py()))
    assert schema.names == stores["scores"].arrow_schema().names
    assert schema.field("v").metadata[b"ARROW:FLIGHT:SQL:TYPE_NAME"] == b"BIGINT"
    assert metadata.tables(stores, "", None, None, [], False).num_rows == 0  # no tables without a catalog
    assert metadata.tables(stores, None, None, None, ["VIEW"], False).num_rows == 0


def test_catalogs_schemas_types_and_keys() -> None:
    assert metadata.catalogs().to_pylist() == [{"catalog_name": "federator"}]
    assert metadata.db_schemas(None, "m%").to_pylist() == [{"catalog_name": "federator", "db_schema_name": "main"}]
    assert metadata.db_schemas("other", None).num_rows == 0
    assert metadata.table_types().column("table_type").to_pylist() == ["SYSTEM TABLE", "TABLE"]
    keys = metadata.primary_keys(_stores(), None, None, "players").to_pylist()
    assert [(k["table_name"], k["column_name"], k["key_sequence"]) for k in keys] == [("players", "key", 1)]
    assert metadata.primary_keys(_stores(), None, "information_schema", "players").num_rows == 0


def test_parameter_rows_become_engine_values() -> None:
    table = pa.table({
        "a": pa.array([1, None], pa.int64()),
        "b": pa.array([dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc), None], pa.timestamp("ms", tz="UTC")),
        "c": pa.array([decimal.Decimal("2.5"), decimal.Decimal("3")], pa.decimal128(5, 1)),
    })
    assert parameter_rows(table) == [[1, "2024-01-02T03:04:05+00:00", 2.5], [None, None, 3]]
    assert parameter_rows(pa.table({})) == []


def test_expiring_handles_drop_the_least_recently_used() -> None:
    reg: Expiring[str] = Expiring(limit=2, ttl=3600)
    a, b = reg.add("a"), reg.add("b")
    assert reg.get(a) == "a"  # a is now the most recently used
    c = reg.add("c")
    assert reg.get(b) is None and reg.get(a) == "a" and reg.get(c) == "c"
    assert reg.pop(a) == "a" and reg.pop(a) is None and len(reg) == 1
    gone: Expiring[str] = Expiring(limit=10, ttl=-1)  # everything is already idle too long
    assert gone.get(gone.add("x")) is None
