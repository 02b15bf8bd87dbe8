"""A complete minimal Federator plugin: a query type, its handler on kv stores, and a SQL rule.

``SELECT COUNT(*) FROM <kv store>`` becomes one KeyCountQuery per partition: each node
counts its keys without decoding a value, and the receiver adds the counts up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pyarrow as pa
from sqlglot import exp

from federator.plan.keys import SubQuery
from federator.plugin import RulePlan, SqlRule, hookimpl
from federator.query.queries import Query


@dataclass(frozen=True)
class KeyCountQuery(Query):
    type_name: ClassVar[str] = "KeyCountQuery"  # how the query is named between nodes


def count_keys(view, query: KeyCountQuery) -> pa.RecordBatch:
    """Runs on the node that holds the partition; ``view`` reads its RocksDB shard."""
    n = sum(1 for _ in view.scan())
    return pa.record_batch({"n": pa.array([n], pa.int64())})


class CountStarRule(SqlRule):
    name = "keycount.count_star"
    store_types = ("kv",)

    def plan(self, select, store):
        if len(select.expressions) != 1 or any(
            select.args.get(a) for a in ("where", "group", "having", "order", "distinct", "qualify", "limit", "offset")
        ):
            return None
        item = select.expressions[0]
        count = item.this if isinstance(item, exp.Alias) else item
        if not (isinstance(count, exp.Count) and isinstance(count.this, exp.Star)):
            return None
        name = item.alias if isinstance(item, exp.Alias) else count.sql(dialect="duckdb")
        calls = [SubQuery(KeyCountQuery(), None)]  # None: every partition

        def combine(fetch):
            total = sum(batch.column("n")[0].as_py() for batch in fetch(calls))
            return pa.table({name: pa.array([total], pa.int64())})

        return RulePlan(calls, "count keys in each partition, add the counts", combine=combine)


@hookimpl
def register_query_types():
    return [KeyCountQuery]


@hookimpl
def register_query_handlers():
    return [("kv", KeyCountQuery, count_keys)]


@hookimpl
def register_sql_rules():
    return [CountStarRule()]
