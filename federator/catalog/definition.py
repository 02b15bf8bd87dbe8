"""Store definitions: what a store is called, where its changelog lives, and its columns.

A definition names its formats and its store type; the registry built at start-up
(federator.plugin) says what those names stand for. A definition is built against it
(``from_dict(d, registry)``), so every StoreDefinition is valid and carries the resolved
objects (``key``, ``value``, ``store_type``): nothing later looks a name up.
"""

from __future__ import annotations

import json
import re
from dataclasses import KW_ONLY, InitVar, dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence, TypeVar

import pyarrow as pa

from federator.formats import JSON_FIELD_TYPES, TIMESTAMP, Format, FormatError, JsonFormat
from federator.query.queries import Query
from federator.errors import FederatorError

NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,199}$")
# Columns every windowed/session store adds, and the record timestamp every store adds.
RESERVED_COLUMNS = ("window_start", "window_end", "rowtime")
T = TypeVar("T")


class DefinitionError(FederatorError, ValueError):
    """A store definition that cannot be used; the message names the field."""

    code = "INVALID_PARAMETER"


class StoreKind(Protocol):
    """What is asked of a store type through a definition (federator.store.types.StoreType is
    one): by the definition itself, and by planning. Declared here, below the stores, so the
    catalog needs nothing of them."""

    @property
    def name(self) -> str: ...
    @property
    def windowed(self) -> bool: ...  # rows carry window_start and window_end
    @property
    def window_sized(self) -> bool: ...  # the definition gives window_size_ms
    @property
    def changelog_layout(self) -> str: ...  # how writers lay out its records: kv, window or session

    def validate(self, defn: StoreDefinition) -> None: ...
    def schema(self, defn: StoreDefinition) -> pa.Schema: ...
    def answers(self, *query_classes: type[Query]) -> bool: ...
    def full_scan_query(self) -> Query: ...
    def decode_row(self, defn: StoreDefinition, key: bytes, stored: bytes) -> tuple | None: ...
    def row_decoder(self, defn: StoreDefinition, columns: Sequence[str] | None = None) -> Any: ...


class TypeLookup(Protocol):
    """Formats and store types by name: the registry (federator.plugin.registry.Registry)."""

    def format(self, name: str, fields: Sequence[tuple[str, str]] | None = None) -> Format: ...
    @property
    def store_types(self) -> Mapping[str, StoreKind]: ...


@dataclass(frozen=True)
class StoreDefinition:
    name: str
    type: str
    topic: str
    partitions: int
    key_format: str
    key_name: str = "key"
    value_format: str = "string"
    value_name: str = "value"
    value_fields: tuple[tuple[str, str], ...] = ()
    window_size_ms: int | None = None
    options: Mapping[str, Any] = field(default_factory=dict)  # store-type specific (plugins)
    # Kafka Streams' GlobalKTable: every node keeps every partition and answers it alone,
    # outside the group's assignment of partitions
    is_global: bool = False
    _: KW_ONLY
    # Where the names above are looked up, once, as the definition is built (and validated).
    types: InitVar[TypeLookup]
    # ---- resolved from ``types``: not part of what the catalog records or compares ---------
    key: Format = field(init=False, compare=False, repr=False)
    value: Format = field(init=False, compare=False, repr=False)
    store_type: StoreKind = field(init=False, compare=False, repr=False)

    def __post_init__(self, types: TypeLookup) -> None:
        key, value, store_type = self._validate(types)
        object.__setattr__(self, "key", key)
        object.__setattr__(self, "value", value)
        object.__setattr__(self, "store_type", store_type)

    # ---- derived -------------------------------------------------------------------------
    @property
    def value_columns(self) -> list[str]:
        if self.value_format == "json":
            return [n for n, _ in self.value_fields]
        return [self.value_name]

    def value_arrow_fields(self) -> list[pa.Field]:
        fmt = self.value
        if isinstance(fmt, JsonFormat):
            return list(fmt.arrow_type)
        return [pa.field(self.value_name, fmt.arrow_type)]

    @property
    def windowed(self) -> bool:
        return self.store_type.windowed

    @property
    def scope(self) -> str:
        """How the nodes hold it, as the catalog, metadata and metrics show it: global (every
        node every partition) or partitioned (each partition on its owner)."""
        return "global" if self.is_global else "partitioned"

    # ---- (de)serialization ---------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        value: dict[str, Any] = {"format": self.value_format}
        if self.value_format == "json":
            value["fields"] = [{"name": n, "type": t} for n, t in self.value_fields]
        else:
            value["name"] = self.value_name
        d: dict[str, Any] = {
            "name": self.name,
            "type": self.type,
            "topic": self.topic,
            "partitions": self.partitions,
            "key": {"name": self.key_name, "format": self.key_format},
            "value": value,
        }
        if self.window_size_ms is not None:
            d["window_size_ms"] = self.window_size_ms
        if self.options:
            d["options"] = dict(self.options)
        if self.is_global:  # only when set: a partitioned store's record stays as it was
            d["global"] = True
        return d

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], types: TypeLookup) -> StoreDefinition:
        """Build and validate against ``types`` (the registry); a bad definition raises
        DefinitionError naming the field."""
        if not isinstance(d, Mapping):
            raise DefinitionError(f"a store definition is a JSON object, got {type(d).__name__}")
        name = d.get("name")
        where = f"store {name!r}" if isinstance(name, str) else "store definition"
        known = {"name", "type", "topic", "partitions", "key", "value", "window_size_ms", "options", "global"}
        extra = sorted(set(d) - known)
        if extra:
            raise DefinitionError(f"{where}: unknown field {extra[0]!r}; fields are {', '.join(sorted(known))}")
        key = d.get("key") or {}
        value = d.get("value") or {}
        if not isinstance(key, Mapping):
            raise DefinitionError(f"{where}: field 'key' must be an object with 'name' and 'format'")
        if not isinstance(value, Mapping):
            raise DefinitionError(f"{where}: field 'value' must be an object with 'format' and 'name' or 'fields'")
        fields = value.get("fields") or ()
        try:
            value_fields = tuple((f["name"], f["type"]) for f in fields)
        except (TypeError, KeyError):
            raise DefinitionError(f"{where}: field 'value.fields' must be a list of {{'name', 'type'}}") from None
        defn = cls(
            name=name,  # type: ignore[arg-type]
            type=d.get("type"),  # type: ignore[arg-type]
            topic=d.get("topic"),  # type: ignore[arg-type]
            partitions=d.get("partitions"),  # type: ignore[arg-type]
            key_format=key.get("format"),
            key_name=key.get("name", "key"),
            value_format=value.get("format"),
            value_name=value.get("name", "value"),
            value_fields=value_fields,
            window_size_ms=d.get("window_size_ms"),
            options=dict(d.get("options") or {}),
            is_global=d.get("global", False),
            types=types,
        )
        return defn

    @classmethod
    def from_json(cls, data: bytes | str, types: TypeLookup) -> StoreDefinition:
        try:
            d = json.loads(data)
        except ValueError as e:
            raise DefinitionError(f"store definition is not valid JSON: {e}") from None
        return cls.from_dict(d, types)

    # ---- validation ----------------------------------------------------------------------
    def _validate(self, types: TypeLookup) -> tuple[Format, Format, StoreKind]:
        """Check every field; the key format, the value format and the store type they name."""
        where = f"store {self.name!r}"
        if not isinstance(self.name, str) or not NAME_RE.match(self.name):
            raise DefinitionError(
                f"field 'name': {self.name!r} is not a valid store name; use letters, digits and _, "
                "starting with a letter or _"
            )
        if not isinstance(self.is_global, bool):
            raise DefinitionError(f"{where}: field 'global' must be true or false, got {self.is_global!r}")
        known = types.store_types
        store_type = known.get(self.type) if isinstance(self.type, str) else None
        if store_type is None:
            raise DefinitionError(
                f"{where}: field 'type': {self.type!r} is not one of {', '.join(known)}; if a plugin provides it, "
                "install the plugin (`federator plugins` lists the installed ones)"
            )
        if not isinstance(self.topic, str) or not re.match(r"^[A-Za-z0-9._-]{1,249}$", self.topic):
            raise DefinitionError(f"{where}: field 'topic': {self.topic!r} is not a valid Kafka topic name")
        if isinstance(self.partitions, bool) or not isinstance(self.partitions, int) or self.partitions < 1:
            raise DefinitionError(f"{where}: field 'partitions' must be a positive integer, got {self.partitions!r}")
        try:
            key = types.format(self.key_format)
        except FormatError as e:
            raise DefinitionError(f"{where}: field 'key.format': {e}") from None
        if not key.key_capable:
            raise DefinitionError(f"{where}: field 'key.format': {self.key_format!r} cannot be a key format")
        if self.value_format == "json":
            if not self.value_fields:
                raise DefinitionError(f"{where}: field 'value.fields': a json value needs at least one field")
            for fname, ftype in self.value_fields:
                if ftype not in JSON_FIELD_TYPES:
                    raise DefinitionError(
                        f"{where}: field 'value.fields': {fname!r} has type {ftype!r}; "
                        f"use one of {', '.join(JSON_FIELD_TYPES)}"
                    )
        elif self.value_fields:
            raise DefinitionError(f"{where}: field 'value.fields' is only for the json format")
        try:
            value = types.format(self.value_format, self.value_fields or None)
        except FormatError as e:
            raise DefinitionError(f"{where}: field 'value.format': {e}") from None
        columns = [self.key_name, *self.value_columns]
        for col in columns:
            if not isinstance(col, str) or not NAME_RE.match(col):
                raise DefinitionError(f"{where}: column name {col!r} is not valid; use letters, digits and _")
            if col.lower() in RESERVED_COLUMNS:
                raise DefinitionError(f"{where}: column name {col!r} is reserved ({', '.join(RESERVED_COLUMNS)})")
        lowered = [c.lower() for c in columns]
        dupes = sorted({c for c in lowered if lowered.count(c) > 1})
        if dupes:
            raise DefinitionError(f"{where}: column {dupes[0]!r} appears twice; key and value columns need distinct names")
        if store_type.window_sized:
            if isinstance(self.window_size_ms, bool) or not isinstance(self.window_size_ms, int) or self.window_size_ms < 1:
                raise DefinitionError(
                    f"{where}: field 'window_size_ms' must be a positive integer for a {self.type} store, "
                    f"got {self.window_size_ms!r}"
                )
        elif self.window_size_ms is not None:
            raise DefinitionError(f"{where}: field 'window_size_ms' is only for window stores")
        try:
            store_type.validate(self)
        except DefinitionError as e:
            raise DefinitionError(f"{where}: {e}") from None
        return key, value, store_type

    def differences(self, other: StoreDefinition) -> list[str]:
        """Human-readable differences, 'field: ours vs theirs'."""
        a, b = _flatten(self.to_dict()), _flatten(other.to_dict())
        return [f"{k}: {a.get(k)!r} vs {b.get(k)!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]

    def arrow_schema(self) -> pa.Schema:
        return self.derived("arrow_schema", self.store_type.schema)

    def row_decoder(self) -> Any:
        """The store type's decoder of a stored entry into every column (``StoreKind.row_decoder``):
        a global leaderboard decodes its few rows with it on every rank."""
        return self.derived("row_decoder", self.store_type.row_decoder)

    def derived(self, name: str, build: Callable[[StoreDefinition], T]) -> T:
        """``build(self)``, made once per definition and kept under ``name``: what queries read
        again and again (a schema costs more to build, and to hash, than a few rows to read)."""
        kept = self.__dict__.get("_derived")
        if kept is None:
            kept = self.__dict__["_derived"] = {}
        if name not in kept:
            kept[name] = build(self)
        return kept[name]


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def parse_value_fields(spec: str) -> tuple[tuple[str, str], ...]:
    """'name:type,name:type' (the CLI's --value-fields) into pairs."""
    pairs = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        name, sep, ftype = part.partition(":")
        if not sep or not name.strip() or not ftype.strip():
            raise DefinitionError(f"--value-fields: {part!r} is not name:type (for example score:long)")
        pairs.append((name.strip(), ftype.strip()))
    if not pairs:
        raise DefinitionError("--value-fields: give at least one name:type")
    return tuple(pairs)


__all__ = ["DefinitionError", "StoreDefinition", "StoreKind", "TypeLookup", "parse_value_fields", "RESERVED_COLUMNS", "TIMESTAMP"]
