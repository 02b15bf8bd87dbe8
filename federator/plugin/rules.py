"""SQL rules: a plugin's way to turn a SQL shape into its own queries.

A rule sees the SELECT with its parameters already bound as literals and the store it
reads, and either declines (returns None) or returns a RulePlan:

- ``subqueries`` only: they replace the built-in key planning. Everything else runs as
  usual: WHERE, projections, partial aggregates and top-k on the owning nodes, the
  finish at the receiver. The subqueries must return every row the SQL could need
  (a superset is fine: WHERE is evaluated again on what comes back).
- ``combine`` too: the receiver builds the rows itself, calling ``fetch`` as many
  times as it needs (a rank needs a score before it can count higher ones), and then
  runs ``remaining`` over them (or returns them as the answer when it is None).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar

import pyarrow as pa
from sqlglot import exp

if TYPE_CHECKING:
    from federator.catalog.definition import StoreDefinition
    from federator.plan.keys import SubQuery

# fetch(subqueries) -> the successful per-partition batches; it raises the usual typed errors
Fetch = Callable[[list["SubQuery"]], list[pa.RecordBatch]]


@dataclass
class RulePlan:
    subqueries: list[SubQuery]
    note: str  # what the rule did, for EXPLAIN
    combine: Callable[[Fetch], pa.Table] | None = None
    remaining: exp.Select | None = None
    # the subqueries' rows already hold every row the statement's ORDER BY ... LIMIT can keep
    # (ties at the cut included): owners send them as they are, without a top-k of their own,
    # and the receiver cuts once (an owner's DuckDB statement costs more than the rows it saves)
    rows_are_top_k: bool = False


class SqlRule:
    """Subclass, set ``name`` (and ``store_types`` to limit where it is tried) and implement ``plan``."""

    name: ClassVar[str]
    store_types: ClassVar[tuple[str, ...] | None] = None  # None: stores of any type

    def plan(self, select: exp.Select, store: StoreDefinition) -> RulePlan | None:
        raise NotImplementedError

    def applies_to(self, store: StoreDefinition) -> bool:
        return self.store_types is None or store.type in self.store_types


def first_plan(rules: list[SqlRule], select: exp.Select, store: StoreDefinition) -> tuple[SqlRule, RulePlan] | None:
    for rule in rules:
        if rule.applies_to(store):
            plan = rule.plan(select, store)
            if plan is not None:
                return rule, plan
    return None


def is_plain_column(node: exp.Expression, name: str) -> bool:
    return isinstance(node, exp.Column) and node.name.lower() == name.lower()


def literal(node: exp.Expression) -> Any:
    """The Python value of a literal (parameters are literals by the time rules run); raises ValueError."""
    from federator.plan.keys import NotALiteral, literal_value

    try:
        return literal_value(node, [])
    except NotALiteral:
        raise ValueError(f"{node.sql()} is not a literal") from None
