"""The Flight SQL protobuf messages Federator speaks, built from the specification at import time.

FlightSql.proto (package ``arrow.flight.protocol.sql``) is not shipped by any Python package, and
generated ``_pb2`` modules are tied to the protobuf release that generated them (newer gencode
refuses older runtimes). So the messages are declared here as data, field numbers copied from the
spec, and turned into classes through a private descriptor pool: no build step, any protobuf 4.25+.
Only the messages the server reads or writes are declared; unknown commands are refused by type URL.
"""

from __future__ import annotations

from typing import Any as _Any

from google.protobuf import any_pb2, descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError, Message

from federator.errors import FederatorError

PACKAGE = "arrow.flight.protocol.sql"
TYPE_URL_PREFIX = "type.googleapis.com/"

_F = descriptor_pb2.FieldDescriptorProto
_TYPES = {"string": _F.TYPE_STRING, "bytes": _F.TYPE_BYTES, "bool": _F.TYPE_BOOL,
          "uint32": _F.TYPE_UINT32, "int32": _F.TYPE_INT32, "int64": _F.TYPE_INT64}

# name -> [(field name, number, type, label)], label: "" singular, "optional" (proto3 optional), "repeated".
_MESSAGES: dict[str, list[tuple[str, int, str, str]]] = {
    "CommandGetSqlInfo": [("info", 1, "uint32", "repeated")],
    "CommandGetCatalogs": [],
    "CommandGetDbSchemas": [("catalog", 1, "string", "optional"), ("db_schema_filter_pattern", 2, "string", "optional")],
    "CommandGetTables": [
        ("catalog", 1, "string", "optional"), ("db_schema_filter_pattern", 2, "string", "optional"),
        ("table_name_filter_pattern", 3, "string", "optional"), ("table_types", 4, "string", "repeated"),
        ("include_schema", 5, "bool", ""),
    ],
    "CommandGetTableTypes": [],
    "CommandGetPrimaryKeys": [("catalog", 1, "string", "optional"), ("db_schema", 2, "string", "optional"),
                              ("table", 3, "string", "")],
    "CommandStatementQuery": [("query", 1, "string", ""), ("transaction_id", 2, "bytes", "optional")],
    "CommandStatementUpdate": [("query", 1, "string", ""), ("transaction_id", 2, "bytes", "optional")],
    "CommandPreparedStatementQuery": [("prepared_statement_handle", 1, "bytes", "")],
    "CommandPreparedStatementUpdate": [("prepared_statement_handle", 1, "bytes", "")],
    "TicketStatementQuery": [("statement_handle", 1, "bytes", "")],
    "DoPutUpdateResult": [("record_count", 1, "int64", "")],
    "DoPutPreparedStatementResult": [("prepared_statement_handle", 1, "bytes", "optional")],
    "ActionCreatePreparedStatementRequest": [("query", 1, "string", ""), ("transaction_id", 2, "bytes", "optional")],
    "ActionCreatePreparedStatementResult": [
        ("prepared_statement_handle", 1, "bytes", ""), ("dataset_schema", 2, "bytes", ""),
        ("parameter_schema", 3, "bytes", ""),
    ],
    "ActionClosePreparedStatementRequest": [("prepared_statement_handle", 1, "bytes", "")],
}


def _file_descriptor() -> descriptor_pb2.FileDescriptorProto:
    fd = descriptor_pb2.FileDescriptorProto(name="federator/flight/FlightSql.proto", package=PACKAGE, syntax="proto3")
    for name, fields in _MESSAGES.items():
        msg = fd.message_type.add(name=name)
        for fname, number, ftype, label in fields:
            f = msg.field.add(name=fname, number=number, type=_TYPES[ftype], json_name=_json_name(fname))
            f.label = _F.LABEL_REPEATED if label == "repeated" else _F.LABEL_OPTIONAL
            if label == "optional":
                # proto3 `optional` is a synthetic one-field oneof named _<field>, so presence is tracked.
                f.proto3_optional = True
                f.oneof_index = len(msg.oneof_decl)
                msg.oneof_decl.add(name=f"_{fname}")
    return fd


def _json_name(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_file_descriptor())
_CLASSES: dict[str, type[Message]] = {
    name: message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{PACKAGE}.{name}")) for name in _MESSAGES
}

CommandGetSqlInfo = _CLASSES["CommandGetSqlInfo"]
CommandGetCatalogs = _CLASSES["CommandGetCatalogs"]
CommandGetDbSchemas = _CLASSES["CommandGetDbSchemas"]
CommandGetTables = _CLASSES["CommandGetTables"]
CommandGetTableTypes = _CLASSES["CommandGetTableTypes"]
CommandGetPrimaryKeys = _CLASSES["CommandGetPrimaryKeys"]
CommandStatementQuery = _CLASSES["CommandStatementQuery"]
CommandStatementUpdate = _CLASSES["CommandStatementUpdate"]
CommandPreparedStatementQuery = _CLASSES["CommandPreparedStatementQuery"]
CommandPreparedStatementUpdate = _CLASSES["CommandPreparedStatementUpdate"]
TicketStatementQuery = _CLASSES["TicketStatementQuery"]
DoPutUpdateResult = _CLASSES["DoPutUpdateResult"]
DoPutPreparedStatementResult = _CLASSES["DoPutPreparedStatementResult"]
ActionCreatePreparedStatementRequest = _CLASSES["ActionCreatePreparedStatementRequest"]
ActionCreatePreparedStatementResult = _CLASSES["ActionCreatePreparedStatementResult"]
ActionClosePreparedStatementRequest = _CLASSES["ActionClosePreparedStatementRequest"]

# DoAction types, as the spec names them.
CREATE_PREPARED_STATEMENT = "CreatePreparedStatement"
CLOSE_PREPARED_STATEMENT = "ClosePreparedStatement"


class ProtocolError(FederatorError, ValueError):
    """Bytes that are not the Flight SQL message they should be."""

    code = "INVALID_PARAMETER"


def type_name(type_url: str) -> str:
    """``type.googleapis.com/arrow.flight.protocol.sql.X`` -> ``X`` (other packages keep their full name)."""
    full = type_url.rsplit("/", 1)[-1]
    return full[len(PACKAGE) + 1:] if full.startswith(PACKAGE + ".") else full


def pack(msg: Message) -> bytes:
    """A message wrapped in google.protobuf.Any, serialized: how commands, tickets and action bodies travel."""
    wrapper = any_pb2.Any()
    wrapper.Pack(msg, type_url_prefix=TYPE_URL_PREFIX)
    return wrapper.SerializeToString()


def unpack(data: bytes) -> tuple[str, Message | None]:
    """The message name and the message inside a serialized Any; None when this module does not know it."""
    wrapper = any_pb2.Any()
    try:
        wrapper.ParseFromString(data)
    except DecodeError as e:
        raise ProtocolError(f"not a serialized google.protobuf.Any: {e}") from None
    name = type_name(wrapper.type_url)
    cls = _CLASSES.get(name)
    if cls is None or not wrapper.type_url.endswith(f"{PACKAGE}.{name}"):
        return name, None
    msg = cls()
    try:
        msg.ParseFromString(wrapper.value)
    except DecodeError as e:
        raise ProtocolError(f"malformed {name}: {e}") from None
    return name, msg


def parse(cls: type[Message], data: bytes) -> _Any:
    """A bare (not Any-wrapped) message, as DoPut app metadata carries them."""
    msg = cls()
    try:
        msg.ParseFromString(data)
    except DecodeError as e:
        raise ProtocolError(f"malformed {cls.DESCRIPTOR.name}: {e}") from None
    return msg
