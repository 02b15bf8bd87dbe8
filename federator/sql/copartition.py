"""Joins run on the owners: of co-partitioned stores, on the nodes that own both shards; of a
partitioned store with a global one, on the partitioned store's owners.

Two stores with the same partition count and key format keep a key in the same partition
number of each (one partitioner over the same key bytes). An equality join on their keys
therefore only pairs rows of partition p with rows of partition p, and Kafka's range assignor
gives both partitions p to the same node: each owner can join its own two shards and no row
crosses the network before the join. The receiver gets the joined rows (filtered, and
aggregated or cut to a top-k when the statement allows it) and runs the statement over them.

Every node keeps every partition of a global store, so the owner of partition p of the other
store joins it with all the global store's rows, whatever the ON condition says (Kafka Streams'
join of a stream with a GlobalKTable): each row of the partitioned store is in one partition,
so each joined row comes from one owner. An inner join may name the global store first; a LEFT
JOIN keeps the partitioned store's rows, so that one must come first.

The statement is rewritten over one relation holding the joined columns, named
``"<alias>.<column>"``; the owners build that relation from their two shards.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import pyarrow as pa
from sqlglot import exp

from federator.catalog.definition import StoreDefinition
from federator.plan.keys import answers_key_queries
from federator.sql import pushdown
from federator.sql.catalog_tables import names_store_schema
from federator.owner.keyjoin import KEY_FORMATS, LEFT, RIGHT
from federator.query.owner_work import Side
from federator.owner.work import ROWS


@dataclass
class CoJoin:
    left: StoreDefinition  # the store whose owners join: the request's (the first, unless swapped)
    right: StoreDefinition  # the store read beside it: partition p of it, or all of a global one
    select: exp.Select  # the statement over one table, ``table``, of the joined columns
    table: exp.Table
    schema: pa.Schema  # the joined columns the owners return
    join_sql: str  # over LEFT and RIGHT: the joined rows with those columns
    left_keys: exp.Expression | None  # conjuncts over the left store's columns alone (key planning)
    # the join as a lookup in Arrow (federator.owner.keyjoin): (left, right, LEFT JOIN), when exact
    lookup: tuple[Side, Side, bool] | None = None
    swapped: bool = False  # ``left`` is the statement's second table (a global store comes first)

    @property
    def broadcast(self) -> bool:
        """A join with a global store: ``right``'s rows all beside each owner's partitions."""
        return self.right.is_global


@dataclass
class _Pair:
    """The two stores of a join the owners can run, as the statement names them."""

    join: exp.Join
    left_t: exp.Table  # the statement's first table
    right_t: exp.Table  # its second
    left: StoreDefinition  # the store whose owners join
    right: StoreDefinition  # the store read beside it
    mode: str  # join_mode's answer
    side_kw: str  # "LEFT" for a LEFT JOIN, else ""
    aliases: dict[str, StoreDefinition]  # alias -> store, in the statement's order
    columns: dict[str, dict[str, str]]  # alias -> lower-case column name -> the column's name

    @property
    def swapped(self) -> bool:
        return self.mode == "broadcast, swapped"

    @property
    def first_alias(self) -> str:
        return list(self.aliases)[0]

    @property
    def second_alias(self) -> str:
        return list(self.aliases)[1]

    @property
    def la(self) -> str:
        """The owners' store's alias."""
        return self.second_alias if self.swapped else self.first_alias

    @property
    def ra(self) -> str:
        """The other store's alias."""
        return self.first_alias if self.swapped else self.second_alias

    def flat(self, col: exp.Column) -> str | None:
        """The joined column ``col`` names, or None when that cannot be told."""
        owner = col.table.lower() if col.table else None
        if owner is None:
            found = [a for a in self.aliases if col.name.lower() in self.columns[a]]
            if len(found) != 1:
                return None
            owner = found[0]
        if owner not in self.aliases or col.name.lower() not in self.columns[owner]:
            return None
        return f"{owner}.{self.columns[owner][col.name.lower()]}"


class _Kept(NamedTuple):
    """A column of the joined relation."""

    alias: str
    column: str
    field: pa.Field


def co_join(select: exp.Select, resolve: Callable[[str], StoreDefinition | None], mentioned: set[str],
            relation: str) -> CoJoin | None:
    """The co-partitioned join ``select`` reads, or None when it reads anything else."""
    pair = _pair(select, resolve)
    if pair is None or select.find(exp.Subquery, exp.Exists, exp.Lambda):
        return None
    keep = _kept(select, pair, mentioned)
    rewritten = _rewritten(select, pair, relation)
    if rewritten is None:
        return None
    join_sql = _owners_join(pair, keep)
    if join_sql is None:
        return None
    schema = pa.schema([k.field.with_name(f"{k.alias}.{k.column}") for k in keep])
    table = rewritten.args["from_"].this  # the relation: the table the rewritten statement reads
    return CoJoin(pair.left, pair.right, rewritten, table, schema, join_sql,
                  _left_keys(select, pair), _lookup(select, pair, keep), pair.swapped)


def _joined_tables(select: exp.Select) -> tuple[exp.Join, exp.Table, exp.Table] | None:
    """The join and its two tables when ``select`` reads two store tables in one equality-
    capable inner or LEFT JOIN with an ON, and nothing else."""
    source = select.args.get("from_") or select.args.get("from")
    joins = select.args.get("joins") or []
    if source is None or len(joins) != 1 or select.args.get("with_") or select.args.get("with"):
        return None
    join = joins[0]
    if (join.args.get("method") or join.args.get("kind") or join.args.get("using")
            or (join.args.get("side") or "").upper() not in ("", "LEFT") or join.args.get("on") is None):
        return None
    left_t, right_t = source.this, join.this
    if not all(isinstance(t, exp.Table) and isinstance(t.this, exp.Identifier) and not t.args.get("joins")
               for t in (left_t, right_t)):
        return None
    if not all(names_store_schema(t.catalog, t.db) for t in (left_t, right_t)):
        return None
    return join, left_t, right_t


def _pair(select: exp.Select, resolve: Callable[[str], StoreDefinition | None]) -> _Pair | None:
    """The two stores ``select`` joins, when their owners can join them (for co-partitioned
    stores: the ON holds the equality of their keys)."""
    tables = _joined_tables(select)
    if tables is None:
        return None
    join, left_t, right_t = tables
    first, second = resolve(left_t.name), resolve(right_t.name)
    if first is None or second is None:
        return None
    side_kw = "LEFT" if (join.args.get("side") or "").upper() == "LEFT" else ""
    mode = join_mode(first, second, bool(side_kw))
    if mode is None:
        return None
    left, right = (second, first) if mode == "broadcast, swapped" else (first, second)
    aliases = {left_t.alias_or_name.lower(): first, right_t.alias_or_name.lower(): second}
    if len(aliases) != 2:
        return None
    columns = {a: {f.name.lower(): f.name for f in d.arrow_schema()} for a, d in aliases.items()}
    pair = _Pair(join, left_t, right_t, left, right, mode, side_kw, aliases, columns)
    if mode == "co-partitioned" and not any(_keys_equal(c, pair.la, pair.ra, left, right)
                                            for c in pushdown.conjuncts(join.args["on"])):
        return None
    return pair


def _kept(select: exp.Select, pair: _Pair, mentioned: set[str]) -> list[_Kept]:
    """Every column the joined relation offers: the ones the statement names, or all for a star
    (at least the owners' store's key)."""
    star = any(not (isinstance(s.parent, exp.Count) and s.parent.this is s) for s in select.find_all(exp.Star, exp.Columns))
    keep: list[_Kept] = []
    for a, d in pair.aliases.items():
        for f in d.arrow_schema():
            if (star and f.name != "rowtime") or f.name.lower() in mentioned:
                keep.append(_Kept(a, f.name, f))
    if not keep:
        keep.append(_Kept(pair.la, pair.left.key_name, pair.left.arrow_schema().field(pair.left.key_name)))
    return keep


def _rewritten(select: exp.Select, pair: _Pair, relation: str) -> exp.Select | None:
    """``select`` over one relation, ``relation``, of the joined columns; None when a column
    cannot be told."""
    rewritten = select.copy()
    for col in list(rewritten.find_all(exp.Column)):
        if isinstance(col.this, exp.Star):
            continue  # a.*: expanded below
        name = pair.flat(col)
        if name is None:
            if pushdown.is_output_alias(col, select):
                continue  # ORDER BY / HAVING naming a select-list alias
            return None
        # an unaliased select item keeps the name DuckDB gives it over the join
        if isinstance(col.parent, exp.Select) and col.arg_key == "expressions":
            col.replace(exp.alias_(exp.column(name, quoted=True), col.name, quoted=True))
        else:
            col.replace(exp.column(name, quoted=True))
    items = _expanded_stars(rewritten.expressions, pair)
    if items is None:
        return None
    rewritten.set("expressions", items)
    rewritten.set("from_", exp.From(this=exp.to_table(relation)))
    rewritten.set("joins", None)
    return rewritten


def _expanded_stars(expressions: list[exp.Expression], pair: _Pair) -> list[exp.Expression] | None:
    """The select list with ``*`` and ``a.*`` spelled out over the joined columns; None for a
    star with EXCEPT, REPLACE or RENAME, or one naming no table of the join."""
    items: list[exp.Expression] = []
    for item in expressions:
        if not (isinstance(item, exp.Star) or (isinstance(item, exp.Column) and isinstance(item.this, exp.Star))):
            items.append(item)
            continue
        star_node = item if isinstance(item, exp.Star) else item.this
        if any(star_node.args.get(k) for k in ("except", "except_", "replace", "rename")):
            return None
        which = [item.table.lower()] if isinstance(item, exp.Column) and item.table else list(pair.aliases)
        if any(w not in pair.aliases for w in which):
            return None
        for a in which:
            for f in pair.aliases[a].arrow_schema():
                if f.name != "rowtime":
                    items.append(exp.alias_(exp.column(f"{a}.{f.name}", quoted=True), f.name, quoted=True))
    return items


def _owners_join(pair: _Pair, keep: list[_Kept]) -> str | None:
    """The join the owners run over LEFT and RIGHT, giving the kept columns; None when a column
    of the ON cannot be told."""
    owner_on = pair.join.args["on"].copy()
    for col in list(owner_on.find_all(exp.Column)):
        name = pair.flat(col)
        if name is None:
            return None
        a, c = name.split(".", 1)
        col.replace(exp.column(c, table=a, quoted=True))
    items_sql = [exp.alias_(exp.column(k.column, table=k.alias, quoted=True), f"{k.alias}.{k.column}", quoted=True)
                 for k in keep]
    # the tables in the statement's order, each the owner's relation for its role
    (first_rel, second_rel) = (RIGHT, LEFT) if pair.swapped else (LEFT, RIGHT)
    return (exp.select(*items_sql).from_(exp.alias_(exp.to_table(first_rel), pair.first_alias, table=True))
            .join(exp.alias_(exp.to_table(second_rel), pair.second_alias, table=True), on=owner_on,
                  join_type=pair.side_kw or None)
            .sql(dialect="duckdb"))


def _left_keys(select: exp.Select, pair: _Pair) -> exp.Expression | None:
    """The WHERE conjuncts over the owners' store's columns alone (for key planning)."""
    where = select.args.get("where")
    left_cols = set(pair.columns[pair.la])
    return pushdown.and_all([pushdown.unqualified(c) for c in pushdown.conjuncts(where.this if where is not None else None)
                             if pushdown.only_reads(c, pair.la, left_cols, False)])


def _lookup(select: exp.Select, pair: _Pair, keep: list[_Kept]) -> tuple[Side, Side, bool] | None:
    """The join as a lookup in Arrow, or None. A lookup is DuckDB's join only when the ON is
    the key equality alone, each side holds a key once (kv stores; plugin types may not) and
    equal keys are equal bytes."""
    left, right = pair.left, pair.right
    if not (pair.mode == "co-partitioned" and left.type == right.type == "kv" and left.key_format in KEY_FORMATS
            and len(pushdown.conjuncts(pair.join.args["on"])) == 1):
        return None
    sides = []
    for a, t, d in ((pair.la, pair.left_t, left), (pair.ra, pair.right_t, right)):
        # the WHERE conjuncts over this side alone that may run before the join (none over
        # the NULL-supplying side of a LEFT JOIN)
        conds = [pushdown.unqualified(c) for c in pushdown.pushable_filter(select, t, set(pair.columns[a]))]
        kept = tuple((k.column, f"{a}.{k.column}") for k in keep if k.alias == a)
        side = Side(d.key_name, kept)
        if conds:
            filtered = exp.select(*[exp.column(c, quoted=True) for c in side.reads]).from_(ROWS)
            side = Side(d.key_name, kept, filtered.where(pushdown.and_all(conds), copy=False).sql(dialect="duckdb"))
        sides.append(side)
    return sides[0], sides[1], bool(pair.side_kw)


def join_mode(first: StoreDefinition, second: StoreDefinition, left_join: bool) -> str | None:
    """How the owners can join ``first`` with ``second`` (the statement's order; ``left_join``:
    a LEFT JOIN): "broadcast" (``second`` is global), "broadcast, swapped" (``first`` is, in
    an inner join), "co-partitioned" (the same partition count and key format: an equality of
    their keys is still to be found), or None: the receiver joins them (two global stores,
    read here anyway; a LEFT JOIN keeping a global store's rows, which many owners would each
    keep; stores partitioned apart)."""
    if first.is_global and second.is_global:
        return None
    if second.is_global:
        return "broadcast"
    if first.is_global:
        return None if left_join else "broadcast, swapped"
    if not (answers_key_queries(first) and answers_key_queries(second)):
        return None
    if first.partitions != second.partitions or first.key_format != second.key_format:
        return None
    return "co-partitioned"


def _keys_equal(node: exp.Expression, la: str, ra: str, left: StoreDefinition, right: StoreDefinition) -> bool:
    if not isinstance(node, exp.EQ):
        return False
    a, b = node.this, node.expression
    if not (isinstance(a, exp.Column) and isinstance(b, exp.Column) and a.table and b.table):
        return False
    pair = {(a.table.lower(), a.name.lower()), (b.table.lower(), b.name.lower())}
    return pair == {(la, left.key_name.lower()), (ra, right.key_name.lower())}
