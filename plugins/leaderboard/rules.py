"""SQL shapes the leaderboard answers with its own queries.

- ``SELECT ... FROM lb ORDER BY score DESC LIMIT k`` (no WHERE, no GROUP BY): a TopKQuery
  per partition, and the usual ORDER BY + LIMIT over what comes back.
- A player's rank, asked the standard way (DuckDB and others run it as is):
  ``SELECT player, score, RANK() OVER (ORDER BY score DESC) AS rank FROM lb QUALIFY player = ?``
  (``IN (...)`` for several). The receiver reads the players' scores, asks every
  partition how many scores are better (RankQuery), and adds them up.
"""

from __future__ import annotations

import pyarrow as pa
from sqlglot import exp

from federator.catalog.definition import StoreDefinition
from federator.partitioner import partition_for
from federator.plan.keys import SubQuery
from federator.plugin.rules import Fetch, RulePlan, SqlRule, is_plain_column, literal
from federator.query.queries import KeysQuery

from plugins.leaderboard.queries import RankQuery, TopKQuery

RANK_COLUMN = "__rank"


def _score_column(store: StoreDefinition) -> str:
    return store.value_columns[0]


def _plain_read(select: exp.Select) -> bool:
    return not any(select.args.get(a) for a in ("where", "group", "having", "qualify", "distinct", "joins"))


class TopKRule(SqlRule):
    name = "leaderboard.top_k"
    store_types = ("leaderboard",)

    def plan(self, select: exp.Select, store: StoreDefinition) -> RulePlan | None:
        order = select.args.get("order")
        limit = select.args.get("limit")
        if not _plain_read(select) or order is None or limit is None or select.find(exp.AggFunc, exp.Window):
            return None
        first = order.expressions[0]
        if not is_plain_column(first.this, _score_column(store)):
            return None
        try:
            k = int(literal(limit.expression))
            offset = select.args.get("offset")
            k += int(literal(offset.expression)) if offset is not None else 0
        except (ValueError, TypeError):
            return None
        descending = bool(first.args.get("desc"))
        return RulePlan(
            [SubQuery(TopKQuery(k, descending), None)],
            f"top {k} by {_score_column(store)} {'DESC' if descending else 'ASC'} from each partition's score index",
            rows_are_top_k=True,  # each partition's top k with the ties at the cut: the receiver's cut is exact
        )


class RankRule(SqlRule):
    name = "leaderboard.rank"
    store_types = ("leaderboard",)

    def plan(self, select: exp.Select, store: StoreDefinition) -> RulePlan | None:
        windows = list(select.find_all(exp.Window))
        if len(windows) != 1 or any(select.args.get(a) for a in ("where", "group", "having", "distinct", "joins")):
            return None
        window = windows[0]
        order = window.args.get("order")
        if (not isinstance(window.this, exp.Rank) or window.args.get("partition_by") or order is None
                or len(order.expressions) != 1 or not is_plain_column(order.expressions[0].this, _score_column(store))):
            return None
        if window.find_ancestor(exp.Select) is not select or not any(item is window or item.this is window
                                                                     for item in select.expressions):
            return None  # RANK() inside a larger expression: leave it to the general path (which refuses it)
        qualify = select.args.get("qualify")
        players = _players(qualify.this if qualify is not None else None, store)
        if players is None:
            return None
        descending = bool(order.expressions[0].args.get("desc"))
        by_partition = sorted({partition_for(store.key.serialize(k), store.partitions) for k in players})
        lookups = [SubQuery(KeysQuery(tuple(players)), tuple(by_partition))]

        def combine(fetch: Fetch) -> pa.Table:
            rows = _concat(fetch(lookups), store)
            scores = rows.column(_score_column(store)).to_pylist()
            better = [0] * len(scores)
            if scores:
                for batch in fetch([SubQuery(RankQuery(tuple(scores), descending), None)]):
                    for i, n in zip(batch.column("i").to_pylist(), batch.column("better").to_pylist()):
                        better[i] += n
            return rows.append_column(RANK_COLUMN, pa.array([b + 1 for b in better], pa.int64()))

        remaining = select.copy()
        remaining.set("qualify", None)
        for node in list(remaining.find_all(exp.Window)):
            replacement = exp.column(RANK_COLUMN)
            if not isinstance(node.parent, exp.Alias):
                replacement = exp.alias_(replacement, window.sql(dialect="duckdb"), quoted=True)
            node.replace(replacement)
        direction = "better" if descending else "lower"
        return RulePlan(
            [*lookups, SubQuery(RankQuery((), descending), None)],
            f"read the players' scores, then count the {direction} scores in every partition's index and sum",
            combine=combine,
            remaining=remaining,
        )


def _players(node: exp.Expression | None, store: StoreDefinition) -> list | None:
    """The keys a QUALIFY clause names (key = v, or key IN (...)); None for any other filter."""
    try:
        if isinstance(node, exp.Paren):
            return _players(node.this, store)
        if isinstance(node, exp.EQ):
            for a, b in ((node.this, node.expression), (node.expression, node.this)):
                if is_plain_column(a, store.key_name):
                    return [store.key.coerce(literal(b))]
        if isinstance(node, exp.In) and is_plain_column(node.this, store.key_name) and not node.args.get("query"):
            return list(dict.fromkeys(store.key.coerce(literal(e)) for e in node.expressions))
    except ValueError:
        return None
    return None


def _concat(batches: list[pa.RecordBatch], store: StoreDefinition) -> pa.Table:
    if not batches:
        return store.arrow_schema().empty_table()
    return pa.Table.from_batches(batches).combine_chunks()

