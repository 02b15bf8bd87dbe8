"""Key predicates → the IQv2 queries that fetch a superset of the matching rows, and their partitions.

The WHERE clause is always evaluated again on the rows that come back, so these
queries only have to cover the answer, never to be exact.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from sqlglot import exp

from federator.catalog.definition import StoreDefinition
from federator.partitioner import partition_for
from federator.query.queries import (
    KeyQuery,
    KeysQuery,
    Query,
    RangeQuery,
    SessionQuery,
    WindowKeyQuery,
    WindowRangeQuery,
)


@dataclass(frozen=True)
class SubQuery:
    """One IQv2 query and the partitions it goes to (None = every partition)."""

    query: Query
    partitions: tuple[int, ...] | None


class NotALiteral(Exception):
    pass


_NUMBER_CASTS = {exp.DataType.Type.BIGINT: int, exp.DataType.Type.DOUBLE: float}


def literal_value(node: exp.Expression, params: list[Any]) -> Any:
    """The Python value of a literal or bound parameter; NotALiteral for anything else."""
    if isinstance(node, exp.Paren):
        return literal_value(node.this, params)
    if isinstance(node, exp.Literal):
        if node.is_string:
            return node.this
        text = node.this
        try:
            return int(text)
        except ValueError:
            return float(text)
    if isinstance(node, exp.Neg):
        v = literal_value(node.this, params)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return -v
        raise NotALiteral
    if isinstance(node, exp.Placeholder):
        idx = node.meta.get("param_index") if node.meta else None
        if idx is None or idx >= len(params):
            raise NotALiteral
        return params[idx]
    if isinstance(node, (exp.Cast, exp.TryCast)) and node.to.this in (exp.DataType.Type.TIMESTAMP, exp.DataType.Type.TIMESTAMPTZ):
        v = literal_value(node.this, params)
        return _millis(v)
    if isinstance(node, exp.Cast) and node.to.this in _NUMBER_CASTS:  # how a bound parameter is typed
        v = literal_value(node.this, params)
        if isinstance(v, bool):
            raise NotALiteral
        try:
            return _NUMBER_CASTS[node.to.this](v)
        except (TypeError, ValueError):
            raise NotALiteral from None
    if isinstance(node, exp.Boolean):
        return node.this
    raise NotALiteral


def _millis(v: Any) -> int:
    if isinstance(v, str):
        t = dt.datetime.fromisoformat(v.replace("Z", "+00:00"))
        if t.tzinfo is None:
            t = t.replace(tzinfo=dt.timezone.utc)
        return int(t.timestamp() * 1000)
    if isinstance(v, dt.datetime):
        return int(v.timestamp() * 1000)
    raise NotALiteral


def _is_col(node: exp.Expression, name: str) -> bool:
    return isinstance(node, exp.Column) and node.name.lower() == name.lower()


# A key constraint: ("points", [v...]) or ("ranges", [(lo, lo_inc, hi, hi_inc), ...]); None = unconstrained
Constraint = tuple[str, list]


def _key_constraint(node: exp.Expression, key: str, fmt_name: str, params: list[Any]) -> Constraint | None:
    """What ``node`` says about the key column, if it says something usable."""
    try:
        if isinstance(node, exp.Paren):
            return _key_constraint(node.this, key, fmt_name, params)
        if isinstance(node, exp.EQ):
            for a, b in ((node.this, node.expression), (node.expression, node.this)):
                if _is_col(a, key):
                    return ("points", [literal_value(b, params)])
        if isinstance(node, exp.In) and _is_col(node.this, key) and not node.args.get("query"):
            return ("points", [literal_value(e, params) for e in node.expressions])
        if isinstance(node, exp.Between) and _is_col(node.this, key):
            return ("ranges", [(literal_value(node.args["low"], params), True, literal_value(node.args["high"], params), True)])
        bounds = {  # col OP v  →  (lower, lower_inclusive, upper, upper_inclusive)
            exp.GT: lambda v: (v, False, None, True),
            exp.GTE: lambda v: (v, True, None, True),
            exp.LT: lambda v: (None, True, v, False),
            exp.LTE: lambda v: (None, True, v, True),
        }
        mirrored = {exp.GT: exp.LT, exp.GTE: exp.LTE, exp.LT: exp.GT, exp.LTE: exp.GTE}
        for cls, make in bounds.items():
            if isinstance(node, cls):
                if _is_col(node.this, key):
                    return ("ranges", [make(literal_value(node.expression, params))])
                if _is_col(node.expression, key):  # v OP col  →  col (mirrored OP) v
                    return ("ranges", [bounds[mirrored[cls]](literal_value(node.this, params))])
        if isinstance(node, exp.Like) and _is_col(node.this, key) and fmt_name == "string":
            pattern = literal_value(node.expression, params)
            if isinstance(pattern, str):
                prefix = like_prefix(pattern)
                if prefix is not None:
                    if prefix == "":
                        return None
                    return ("ranges", [(prefix, True, prefix_end(prefix), False)])
        if isinstance(node, exp.Or):
            left = _key_constraint(node.this, key, fmt_name, params)
            right = _key_constraint(node.expression, key, fmt_name, params)
            if left is None or right is None:
                return None
            if left[0] == right[0] == "points":
                return ("points", left[1] + right[1])
            return ("ranges", _as_ranges(left) + _as_ranges(right))
    except (NotALiteral, ValueError, TypeError):
        return None
    return None


def _as_ranges(c: Constraint) -> list:
    if c[0] == "ranges":
        return list(c[1])
    return [(v, True, v, True) for v in c[1]]


def like_prefix(pattern: str) -> str | None:
    """'abc%' → 'abc'; None when the pattern is not a plain prefix match."""
    if not pattern.endswith("%"):
        return None
    body = pattern[:-1]
    if "%" in body or "_" in body or "\\" in body:
        return None
    return body


def prefix_end(prefix: str) -> str | None:
    """The smallest string above every string starting with ``prefix`` (None = no bound)."""
    chars = list(prefix)
    while chars:
        c = ord(chars[-1])
        if c < 0x10FFFF:
            chars[-1] = chr(c + 1)
            return "".join(chars)
        chars.pop()
    return None


def conjuncts(where: exp.Expression | None) -> list[exp.Expression]:
    if where is None:
        return []
    if isinstance(where, exp.And):
        return conjuncts(where.this) + conjuncts(where.expression)
    if isinstance(where, exp.Paren):
        inner = where.this
        if isinstance(inner, exp.And):
            return conjuncts(inner)
    return [where]


def _coerce_points(defn: StoreDefinition, values: list) -> list | None:
    out = []
    for v in values:
        if v is None:
            continue  # key = NULL matches nothing
        try:
            out.append(defn.key.coerce(v))
        except ValueError:
            return None  # a type that cannot be a key: scan, and let WHERE decide
    return out


def _time_bounds(parts: list[exp.Expression], params: list[Any]) -> tuple[int | None, int | None]:
    """window_start bounds from conjuncts like window_start >= TIMESTAMP '...'."""
    lo: int | None = None
    hi: int | None = None
    for node in parts:
        try:
            if isinstance(node, exp.Between) and _is_col(node.this, "window_start"):
                lo = _max(lo, _millis_of(node.args["low"], params))
                hi = _min(hi, _millis_of(node.args["high"], params))
            elif isinstance(node, (exp.GT, exp.GTE)) and _is_col(node.this, "window_start"):
                lo = _max(lo, _millis_of(node.expression, params))
            elif isinstance(node, (exp.LT, exp.LTE)) and _is_col(node.this, "window_start"):
                hi = _min(hi, _millis_of(node.expression, params))
            elif isinstance(node, exp.EQ) and _is_col(node.this, "window_start"):
                t = _millis_of(node.expression, params)
                lo, hi = _max(lo, t), _min(hi, t)
        except (NotALiteral, ValueError):
            continue
    return lo, hi


def _millis_of(node: exp.Expression, params: list[Any]) -> int:
    v = literal_value(node, params)
    if isinstance(v, bool):
        raise NotALiteral
    if isinstance(v, (int, float)):
        return int(v)
    return _millis(v)


def _max(a: int | None, b: int) -> int:
    return b if a is None else max(a, b)


def _min(a: int | None, b: int) -> int:
    return b if a is None else min(a, b)


def plan_store_queries(defn: StoreDefinition, where: exp.Expression | None, params: list[Any]) -> list[SubQuery]:
    """The sub-queries that fetch every row WHERE can accept, on as few partitions as possible."""
    parts = conjuncts(where)
    key = defn.key_name
    best: Constraint | None = None
    for node in parts:
        c = _key_constraint(node, key, defn.key_format, params)
        if c is None:
            continue
        if c[0] == "points" and (best is None or best[0] != "points" or len(c[1]) < len(best[1])):
            best = c
        elif best is None:
            best = c
    # What the store's type answers decides the queries (never its name): windows by key and
    # start time, sessions by key, or key lookups and ranges; else the type's own full scan.
    store_type = defn.store_type
    if store_type.answers(WindowKeyQuery, WindowRangeQuery):
        lo, hi = _time_bounds(parts, params)
        if best is not None and best[0] == "points":
            points = _coerce_points(defn, best[1])
            if points is not None:
                return _by_partition(defn, points, lambda k: WindowKeyQuery(k, lo, hi))
        return [SubQuery(WindowRangeQuery(lo, hi), None)]
    if store_type.answers(SessionQuery, WindowRangeQuery):
        if best is not None and best[0] == "points":
            points = _coerce_points(defn, best[1])
            if points is not None:
                return _by_partition(defn, points, lambda k: SessionQuery(k))
        return [SubQuery(WindowRangeQuery(None, None), None)]
    if not answers_key_queries(defn):
        return [SubQuery(store_type.full_scan_query(), None)]
    if best is None:
        return [SubQuery(RangeQuery(), None)]
    if best[0] == "points":
        points = _coerce_points(defn, best[1])
        if points is None:
            return [SubQuery(RangeQuery(), None)]
        points = list(dict.fromkeys(points))
        if len(points) == 1:
            p = partition_for(defn.key.serialize(points[0]), defn.partitions)
            return [SubQuery(KeyQuery(points[0]), (p,))]
        parts_of = sorted({partition_for(defn.key.serialize(k), defn.partitions) for k in points})
        return [SubQuery(KeysQuery(tuple(points)), tuple(parts_of))]
    out = []
    for lo, lo_inc, hi, hi_inc in best[1]:
        try:
            lo_v = None if lo is None else defn.key.coerce(lo)
            hi_v = None if hi is None else defn.key.coerce(hi)
        except ValueError:
            return [SubQuery(RangeQuery(), None)]
        out.append(SubQuery(RangeQuery(lo_v, hi_v, lo_inc, hi_inc), None))
    return _merge_ranges(out)


def answers_key_queries(defn: StoreDefinition) -> bool:
    """Whether the store's type answers key lookups and key ranges (kv, and plugin types built on
    it): rows are one per key, so a key's row lives in the key's partition."""
    store_type = defn.store_type
    return not store_type.windowed and store_type.answers(KeyQuery, KeysQuery, RangeQuery)


def _merge_ranges(subs: list[SubQuery]) -> list[SubQuery]:
    """Disjoint ranges covering the same keys: overlapping ones would return rows twice."""
    if len(subs) <= 1:
        return subs
    ranges = sorted((sq.query for sq in subs), key=_lower_order)  # type: ignore[arg-type]
    merged: list[RangeQuery] = [ranges[0]]
    for r in ranges[1:]:
        last = merged[-1]
        if _touches(last, r):
            if last.upper is None or r.upper is None:
                upper, upper_inc = None, True
            elif r.upper > last.upper:
                upper, upper_inc = r.upper, r.upper_inclusive
            elif r.upper == last.upper:
                upper, upper_inc = r.upper, r.upper_inclusive or last.upper_inclusive
            else:
                upper, upper_inc = last.upper, last.upper_inclusive
            merged[-1] = RangeQuery(last.lower, upper, last.lower_inclusive, upper_inc)
        else:
            merged.append(r)
    return [SubQuery(q, None) for q in merged]


def _lower_order(q: RangeQuery) -> tuple:
    # open lower bounds first, then by value, an inclusive bound before an exclusive one
    return (0,) if q.lower is None else (1, q.lower, not q.lower_inclusive)


def _touches(a: RangeQuery, b: RangeQuery) -> bool:
    """Whether b (starting at or after a) overlaps or adjoins a, so one range can cover both."""
    if a.upper is None or b.lower is None:
        return True
    if b.lower < a.upper:
        return True
    return b.lower == a.upper and (a.upper_inclusive or b.lower_inclusive)


def _by_partition(defn: StoreDefinition, points: list, make) -> list[SubQuery]:
    out = []
    for k in dict.fromkeys(points):
        p = partition_for(defn.key.serialize(k), defn.partitions)
        out.append(SubQuery(make(k), (p,)))
    return out
