"""What an owner does with its partitions' rows before it answers: the work the receiver's
planner pushed down (federator.sql.pushdown decides it; federator.owner runs it), as it
travels in a StateQueryRequest."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Side:
    """One store of a join done as a key lookup (federator.owner.keyjoin)."""

    key: str  # the store's key column
    columns: tuple[tuple[str, str], ...]  # (the store's column, its name in the joined rows)
    filter: str | None = None  # SQL over ``rows``: the side's key and columns, its own conjuncts applied

    @property
    def reads(self) -> list[str]:
        return list(dict.fromkeys([self.key, *(c for c, _ in self.columns)]))

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "columns": [list(c) for c in self.columns], "filter": self.filter}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Side:
        return cls(d["key"], tuple((c, n) for c, n in d["columns"]), d.get("filter"))


@dataclass(frozen=True)
class KeyJoin:
    """A co-partitioned equality join of two kv stores' keys, as a lookup in Arrow."""

    left: Side
    right: Side
    keep_unmatched: bool  # LEFT JOIN: every left row, the right's columns NULL where it has no match
    join_sql: str  # the same join in DuckDB, over LEFT and RIGHT: the joined rows
    sql: str  # the owner's SQL over the joined rows (``rows``)
    columns: tuple[str, ...] | None = None  # when ``sql`` only picks these columns of the joined rows
    kind: str = "columns"  # what ``sql`` does (filter, top-k, partial aggregate), for EXPLAIN

    def to_dict(self) -> dict[str, Any]:
        return {"left": self.left.to_dict(), "right": self.right.to_dict(), "keep_unmatched": self.keep_unmatched,
                "join_sql": self.join_sql, "sql": self.sql,
                "columns": None if self.columns is None else list(self.columns), "kind": self.kind}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> KeyJoin:
        columns = d.get("columns")
        return cls(Side.from_dict(d["left"]), Side.from_dict(d["right"]), bool(d["keep_unmatched"]), d["join_sql"],
                   d["sql"], None if columns is None else tuple(columns), d.get("kind", "columns"))

    def describe(self) -> str:
        """What EXPLAIN shows the owners doing."""
        filters = "; ".join(f"{n} first: {s.filter}" for n, s in (("left", self.left), ("right", self.right))
                            if s.filter is not None)
        join = "left join" if self.keep_unmatched else "join"
        return f"{join} as a key lookup in Arrow{f' ({filters})' if filters else ''}, then {self.kind}: {self.sql}"


@dataclass(frozen=True)
class OwnerWork:
    """The SQL an owner runs over its partitions' rows (None: the columns alone), and the
    co-partitioned store whose partition p it joins in first, when there is one."""

    columns: tuple[str, ...]
    sql: str | None = None
    kind: str = "columns"  # columns | filter | top-k | partial aggregate
    join: str | None = None  # the other store of a co-partitioned join (``sql`` reads both)
    key_join: KeyJoin | None = None  # with ``join``: the join as a key lookup, in place of ``sql``'s

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"columns": list(self.columns), "kind": self.kind}
        if self.sql is not None:
            d["sql"] = self.sql
        if self.join is not None:
            d["join"] = self.join
        if self.key_join is not None:
            d["key_join"] = self.key_join.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> OwnerWork:
        key_join = d.get("key_join")
        return cls(tuple(d.get("columns") or ()), d.get("sql"), d.get("kind", "columns"), d.get("join"),
                   None if key_join is None else KeyJoin.from_dict(key_join))

    def describe(self) -> str:
        if self.key_join is not None:
            return self.key_join.describe()
        return f"columns {', '.join(self.columns)}" if self.sql is None else f"{self.kind}: {self.sql}"
