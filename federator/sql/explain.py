"""EXPLAIN: where a planned statement's reads go and what each node does with them."""

from __future__ import annotations

import pyarrow as pa

from federator.node.protocol import ServingNode
from federator.sql.planner import QueryPlan

COLUMNS = ("store", "query", "partitions", "node", "pushed_down", "at_receiver")


def explain(plan: QueryPlan, node: ServingNode) -> pa.Table:
    """EXPLAIN's table: a row for each store query and the nodes that answer its partitions,
    with what is pushed down to them and what is left to the receiver."""
    rows: dict[str, list] = {k: [] for k in COLUMNS}
    view = node.view
    at_receiver = "DuckDB: " + plan.sql + "".join(f" ({n})" for n in plan.notes)
    for ref in plan.refs:
        via = "; ".join(f"via {n}" for n in ref.notes)
        pushed = ("rows built by the rule" if ref.combine is not None
                  else ref.key_join.describe() if ref.key_join is not None else ref.work.describe())
        if ref.store.is_global:
            via = "; ".join(filter(None, [via, "via global store: this node's own copies"]))
        for sq in ref.subqueries:
            parts = sq.partitions if sq.partitions is not None else range(ref.store.partitions)
            by_node: dict[str, list[int]] = {}
            for p in parts:
                owner = None if ref.store.is_global else view.active_owner(ref.store.name, p)
                node_id = node.node_id if ref.store.is_global else owner.node_id if owner else "(no owner)"
                by_node.setdefault(node_id, []).append(p)
            for node_id, ps in sorted(by_node.items()):
                rows["store"].append(ref.store.name)
                rows["query"].append(repr(sq.query) + (f" {via}" if via else ""))
                rows["partitions"].append(",".join(map(str, ps)))
                rows["node"].append(node_id + (" (local)" if node_id == node.node_id else ""))
                rows["pushed_down"].append(pushed)
                rows["at_receiver"].append(at_receiver)
    for lr in plan.local:
        for k, v in zip(COLUMNS, ["(catalog)", lr.relation, "", node.node_id + " (local)",
                                           "nothing", at_receiver]):
            rows[k].append(v)
    if not plan.refs and not plan.local:
        for k, v in zip(COLUMNS, ["(none)", "", "", node.node_id + " (local)", "nothing", at_receiver]):
            rows[k].append(v)
    return pa.table({k: pa.array(v, pa.string()) for k, v in rows.items()})
