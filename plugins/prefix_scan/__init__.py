"""Prefix-scan plugin: ``PrefixScanQuery`` on the built-in kv stores, and the SQL rule that
sends ``WHERE key LIKE 'abc%'`` to it (a seek to the prefix and a scan that stops where
the prefix ends). It adds a query to a store type it does not own."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import pyarrow as pa
from sqlglot import exp

from federator.catalog.definition import StoreDefinition
from federator.formats import prefix_stop
from federator.plan.keys import SubQuery, conjuncts, like_prefix
from federator.plugin import RulePlan, SqlRule, hookimpl
from federator.plugin.rules import is_plain_column, literal
from federator.query.queries import Query
from federator.store.arrow import build_batch
from federator.query.rows import empty_batch
from federator.store.view import ShardView


@dataclass(frozen=True)
class PrefixScanQuery(Query):
    """Every row whose key starts with ``prefix`` (string keys: the UTF-8 bytes of it)."""

    type_name: ClassVar[str] = "PrefixScanQuery"
    prefix: Any = ""


def prefix_scan(view: ShardView, q: PrefixScanQuery) -> pa.RecordBatch:
    start = view.definition.key.serialize(q.prefix)
    keys, stored = [], []
    for k, v in view.scan(start, prefix_stop(start)):
        keys.append(k)
        stored.append(v)
    return build_batch(view.schema, view.definition, keys, stored) if keys else empty_batch(view.schema)


class PrefixLikeRule(SqlRule):
    name = "prefix_scan.like"
    store_types = ("kv",)

    def plan(self, select: exp.Select, store: StoreDefinition) -> RulePlan | None:
        where = select.args.get("where")
        if store.key_format != "string" or where is None:
            return None
        prefix = None
        for node in conjuncts(where.this):
            if isinstance(node, (exp.EQ, exp.In)) and is_plain_column(node.this, store.key_name):
                return None  # a key lookup beats a prefix scan: leave it to the built-in planning
            if isinstance(node, exp.Like) and is_plain_column(node.this, store.key_name):
                try:
                    pattern = literal(node.expression)
                except ValueError:
                    continue
                found = like_prefix(pattern) if isinstance(pattern, str) else None
                if found:
                    prefix = found
        if prefix is None:
            return None
        return RulePlan([SubQuery(PrefixScanQuery(prefix), None)], f"scan keys starting with {prefix!r}")


@hookimpl
def register_query_types():
    return [PrefixScanQuery]


@hookimpl
def register_query_handlers():
    return [("kv", PrefixScanQuery, prefix_scan)]


@hookimpl
def register_sql_rules():
    return [PrefixLikeRule()]
