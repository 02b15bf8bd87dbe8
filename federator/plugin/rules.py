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
  ``fetch(subqueries, keep=True)`` is for queries whose answer depends on nothing but the
  partition's state (a partition's whole index): the receiver keeps each partition's
  answer and gives it again, without a call, while the partition has not moved.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Protocol

import pyarrow as pa
from sqlglot import exp

from federator.plan.keys import NotALiteral, literal_value

if TYPE_CHECKING:
    from federator.catalog.definition import StoreDefinition
    from federator.plan.keys import SubQuery

class Fetch(Protocol):
    """fetch(subqueries) -> the successful per-partition batches; it raises the usual typed
    errors. keep=True: answers may come from, and go to, the receiver's kept answers, which
    ``keeps`` says it has (not where answers are never reused, nor for allow_stale reads)."""

    keeps: bool
    # rows of the last keep=True call's answers asked again because their partition moved
    # since they were kept (what writes cost a rule that reads whole partitions)
    refreshed_rows: int

    def __call__(self, subqueries: list[SubQuery], keep: bool = False) -> list[pa.RecordBatch]: ...


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
    # each subquery's answer depends on nothing but its partition's state (a partition's top k):
    # kept, and given again while the partition stays where it was, as a combine's
    # ``fetch(..., keep=True)`` is; so a statement asked again after a write reads only the
    # partitions the write moved. (Nothing is kept for a global store: Dispatcher.gather.)
    keep_answers: bool = False
    # the plan for the same statement with other values of its parameters, given as the literals
    # they bind to (index: ``parameter_of``); None when more than subqueries and combine would
    # change. The receiver then plans a statement's text once, not once per value.
    rebind: Callable[[list[exp.Expression]], RulePlan | None] | None = None


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
    try:
        return literal_value(node, [])
    except NotALiteral:
        raise ValueError(f"{node.sql()} is not a literal") from None


def parameter_of(node: exp.Expression) -> int | None:
    """Which of the statement's parameters ``node`` was bound from (0-based), or None."""
    return node.meta.get(BOUND_PARAMETER) if node.meta else None


BOUND_PARAMETER = "bound_parameter"  # meta of a literal bound from a parameter: its index
