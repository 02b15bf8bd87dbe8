"""What a store reference can hand to the owners of its partitions.

For each store read somewhere in a statement (FROM, JOIN, subquery, CTE body, set-operation
branch) the receiver works out, from the SELECT that reads it:

- the conjuncts of WHERE (and of its own JOIN ... ON) that touch only that store and mean
  the same on a partition's rows as on all of them: they pick the partitions and key ranges
  (federator.plan.keys) and run on the owners;
- the columns the statement can use at all (every name it mentions, or all for a star);
- for a single-store SELECT, ORDER BY ... LIMIT as a per-partition top-k, and COUNT, SUM,
  MIN, MAX and AVG as per-partition partial aggregates that the receiver merges.

Each owner runs its part in DuckDB over its partition's rows; the receiver runs the whole
statement in DuckDB over what comes back. A filter applied twice filters the same rows, so
the answer is DuckDB's over the same rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from federator.owner.work import ROWS


# Functions whose value differs between the owner and the receiver, or call to call.
_VOLATILE = {"rand", "random", "uuid", "gen_random_uuid", "setseed", "now", "currenttimestamp", "currentdate",
             "currenttime", "currentdatetime", "get_current_timestamp", "get_current_time", "today",
             "transaction_timestamp", "nextval", "currval", "currenttimestampltz"}
# Joins whose sides cannot be filtered ahead: a filter changes which rows pair up.
_POSITIONAL = {"POSITIONAL", "ASOF"}
_MERGEABLE = (exp.Count, exp.Sum, exp.Min, exp.Max, exp.Avg)


def _name(node: exp.Expression) -> str:
    if isinstance(node, exp.Anonymous):
        return str(node.this).lower()
    return type(node).__name__.lower()


def is_volatile(node: exp.Expression) -> bool:
    return any(_name(n) in _VOLATILE for n in node.walk() if isinstance(n, exp.Func))


def conjuncts(node: exp.Expression | None) -> list[exp.Expression]:
    if node is None:
        return []
    if isinstance(node, exp.Paren):
        return conjuncts(node.this)
    if isinstance(node, exp.And):
        return conjuncts(node.this) + conjuncts(node.expression)
    return [node]


def only_reads(node: exp.Expression, alias: str, columns: set[str], single_source: bool) -> bool:
    """Whether ``node`` reads nothing but the columns of the source called ``alias`` (and
    means the same on any subset of its rows)."""
    if node.find(exp.Subquery, exp.Exists, exp.AggFunc, exp.Window, exp.Placeholder, exp.Star, exp.Select,
                 exp.Lambda, exp.Columns):
        return False
    if is_volatile(node):
        return False
    for col in node.find_all(exp.Column):
        if col.table:
            if col.table.lower() != alias.lower():
                return False
        elif not single_source:
            return False
        if col.name.lower() not in columns:
            return False
    return True


def unqualified(node: exp.Expression) -> exp.Expression:
    """A copy of ``node`` with its columns' table qualifiers dropped (the owner reads ``rows``)."""
    copy = node.copy()
    for col in copy.find_all(exp.Column):
        col.set("table", None)
        col.set("db", None)
        col.set("catalog", None)
    return copy


def pushable_filter(select: exp.Select, table: exp.Table, columns: set[str]) -> list[exp.Expression]:
    """The conjuncts of ``select`` that an owner of ``table``'s partitions can apply."""
    joins = select.args.get("joins") or []
    if any((j.args.get("method") or "").upper() in _POSITIONAL or (j.args.get("kind") or "").upper() in
           ("SEMI", "ANTI", "ASOF") or (j.args.get("method") or "").upper() == "NATURAL" for j in joins):
        return []
    alias = table.alias_or_name
    single = not joins
    source = select.args.get("from_") or select.args.get("from")
    mine = next((j for j in joins if j.this is table), None)
    # A table is null-supplying when an outer join can add rows of NULLs in its place: a
    # WHERE over its columns then sees rows its owners never had.
    if mine is None:
        null_supplying = any((j.args.get("side") or "").upper() in ("RIGHT", "FULL") for j in joins)
    else:
        index = joins.index(mine)
        null_supplying = (mine.args.get("side") or "").upper() in ("LEFT", "FULL") or any(
            (j.args.get("side") or "").upper() in ("RIGHT", "FULL") for j in joins[index + 1:])
    if source is None or (mine is None and source.this is not table):
        return []
    found: list[exp.Expression] = []
    where = select.args.get("where")
    if where is not None and not null_supplying:
        found += [c for c in conjuncts(where.this) if only_reads(c, alias, columns, single)]
    if mine is not None and (mine.args.get("side") or "").upper() in ("", "LEFT") and not any(
            (j.args.get("side") or "").upper() in ("RIGHT", "FULL") for j in joins[joins.index(mine) + 1:]):
        found += [c for c in conjuncts(mine.args.get("on")) if only_reads(c, alias, columns, False)]
    return found


def and_all(parts: list[exp.Expression]) -> exp.Expression | None:
    """The conjunction of ``parts``, which it takes over (pass copies: a long IN list costs
    seconds to copy)."""
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0]
    return exp.and_(*[exp.paren(p, copy=False) if isinstance(p, exp.Or) else p for p in parts], copy=False)


def reads_everything(select: exp.Select, table: exp.Table) -> bool:
    """Whether ``select`` can reach every column of ``table`` without naming them."""
    alias = table.alias_or_name.lower()
    for star in select.find_all(exp.Star, exp.Columns):
        if isinstance(star.parent, exp.Count) and star.parent.this is star:
            continue
        return True
    if any((j.args.get("method") or "").upper() == "NATURAL" for j in select.args.get("joins") or []):
        return True
    # the table itself as a value (DuckDB: SELECT t FROM t gives a struct of the row)
    return any(c.name.lower() == alias and not c.table for c in select.find_all(exp.Column))


def named(tree: exp.Expression) -> set[str]:
    """Every identifier a statement mentions (lower case): a superset of the columns it reads."""
    return {i.name.lower() for i in tree.find_all(exp.Identifier)} | {
        str(v.this).lower() for v in tree.find_all(exp.Var)}


def integer(node: exp.Expression | None) -> int | None:
    if node is None:
        return None
    value = node.expression if isinstance(node, (exp.Limit, exp.Offset)) else node
    if isinstance(value, exp.Literal) and not value.is_string and value.this.isdigit():
        return int(value.this)
    return None


def _resolve(node: exp.Expression, select: exp.Select, columns: set[str]) -> exp.Expression | None:
    """An ORDER BY / GROUP BY item as an expression over the source: ordinals and select-list
    aliases replaced by what they name; None when that cannot be told."""
    outputs = select.expressions
    if isinstance(node, exp.Literal) and not node.is_string:
        i = int(node.this) if node.this.isdigit() else 0
        if not 1 <= i <= len(outputs):
            return None
        item = outputs[i - 1]
        return item.this if isinstance(item, exp.Alias) else item
    if isinstance(node, exp.Column) and not node.table and node.name.lower() not in columns:
        for item in outputs:
            if isinstance(item, exp.Alias) and item.alias.lower() == node.name.lower():
                return item.this
        return None
    return node


def top_k(select: exp.Select, table: exp.Table, columns: set[str]) -> tuple[list[exp.Ordered], int] | None:
    """ORDER BY items and the rows each partition keeps, when ``select`` (reading only
    ``table``) is a top-k that an owner can cut to offset + limit rows."""
    order, limit = select.args.get("order"), integer(select.args.get("limit"))
    if order is None or limit is None or select.args.get("joins"):
        return None
    offset = select.args.get("offset")
    skip = integer(offset) if offset is not None else 0
    if skip is None:
        return None
    if any(select.args.get(a) for a in ("group", "having", "distinct", "qualify")) or select.find(exp.AggFunc, exp.Window):
        return None
    items = []
    for o in order.expressions:
        target = _resolve(o.this, select, columns)
        if target is None or not only_reads(target, table.alias_or_name, columns, True):
            return None
        if not any(True for _ in target.find_all(exp.Column)):
            continue  # a constant orders nothing (and a bare number would read as an ordinal)
        items.append(exp.Ordered(this=unqualified(target), desc=o.args.get("desc"), nulls_first=o.args.get("nulls_first")))
    # DuckDB's LIMIT is a BIGINT; LIMIT 0 computes nothing, not even the order (whose values may fail)
    return items, 0 if limit == 0 else min(skip + limit, 2**63 - 1)


@dataclass
class PartialAggregate:
    owner_select: exp.Select  # per partition: group keys __g*, states __a*
    final: exp.Select  # the statement over the states


def partial_aggregate(select: exp.Select, table: exp.Table, columns: set[str], relation: str,
                      names: list[str]) -> PartialAggregate | None:
    """COUNT/SUM/MIN/MAX/AVG with GROUP BY split into per-partition states and their merge."""
    alias = table.alias_or_name
    keys = _group_keys(select, alias, columns)
    if keys is None:
        return None
    owner_items: list[exp.Expression] = [exp.alias_(unqualified(k), f"__g{i}", quoted=True) for i, k in enumerate(keys)]
    merges = _states(select, alias, columns, owner_items)
    if merges is None:
        return None
    owner = exp.select(*owner_items).from_(ROWS)
    where = select.args.get("where")
    if where is not None:
        owner = owner.where(unqualified(where.this))
    if keys:
        owner = owner.group_by(*[unqualified(k) for k in keys])
    final = _merged(select, keys, merges, relation, names)
    return None if final is None else PartialAggregate(owner, final)


def _group_keys(select: exp.Select, alias: str, columns: set[str]) -> list[exp.Expression] | None:
    """The GROUP BY keys of a statement whose aggregates the owners may compute per partition
    (its filter and keys read the store's columns alone); None for any other statement."""
    if select.args.get("joins") or select.args.get("distinct") or select.args.get("qualify"):
        return None
    if select.find(exp.Window, exp.Subquery, exp.Exists, exp.Lambda, exp.Star, exp.Columns) and not _only_count_stars(select):
        return None
    group = select.args.get("group")
    if group is not None and (group.args.get("all") or any(group.args.get(a) for a in ("rollup", "cube", "grouping_sets"))
                              or any(isinstance(g, (exp.Rollup, exp.Cube, exp.GroupingSets)) for g in group.expressions)):
        return None
    if group is None and select.find(exp.AggFunc) is None:
        return None
    where = select.args.get("where")
    if where is not None and not all(only_reads(c, alias, columns, True) for c in conjuncts(where.this)):
        return None
    keys: list[exp.Expression] = []
    for g in group.expressions if group is not None else []:
        target = _resolve(g, select, columns)
        if target is None or not only_reads(target, alias, columns, True):
            return None
        keys.append(target)
    return keys


def _states(select: exp.Select, alias: str, columns: set[str],
            owner_items: list[exp.Expression]) -> dict[str, exp.Expression] | None:
    """Each aggregate's per-partition states (added to ``owner_items`` as ``__a*``) and, by its
    SQL, the merge of them; None when one cannot be split so."""
    merges: dict[str, exp.Expression] = {}
    for a in select.find_all(exp.AggFunc):
        if not isinstance(a, _MERGEABLE) or isinstance(a.parent, exp.Filter) or isinstance(a.this, exp.Distinct):
            return None
        if a.find_ancestor(exp.AggFunc) is not None or any(a.args.get(k) for k in ("order", "ignore_nulls")):
            return None
        arg = a.this
        star = isinstance(arg, exp.Star)
        if not star and (arg is None or not only_reads(arg, alias, columns, True) or len(a.expressions or []) > 0):
            return None
        text = unqualified(a).sql(dialect="duckdb")
        if text in merges:
            continue
        state = f"__a{len(merges)}"
        value = None if star else unqualified(arg)
        if isinstance(a, exp.Count):
            owner_items.append(exp.alias_(exp.Count(this=exp.Star()) if star else exp.Count(this=value), state, quoted=True))
            merge: exp.Expression = exp.cast(exp.func("COALESCE", exp.Sum(this=exp.column(state, quoted=True)),
                                                       exp.Literal.number(0)), "BIGINT")
        elif isinstance(a, exp.Avg):
            owner_items.append(exp.alias_(exp.Sum(this=value), state + "s", quoted=True))
            owner_items.append(exp.alias_(exp.Count(this=value.copy()), state + "c", quoted=True))
            merge = exp.cast(exp.Div(this=exp.Sum(this=exp.column(state + "s", quoted=True)),
                                     expression=exp.Sum(this=exp.column(state + "c", quoted=True))), "DOUBLE")
        else:
            owner_items.append(exp.alias_(type(a)(this=value), state, quoted=True))
            merge = type(a)(this=exp.column(state, quoted=True))
        merges[text] = merge
    return merges


def _merged(select: exp.Select, keys: list[exp.Expression], merges: dict[str, exp.Expression], relation: str,
            names: list[str]) -> exp.Select | None:
    """The statement over the states in ``relation``: its aggregates their merges, its group
    keys ``__g*``; None when something still reads a source column (not grouped: the ordinary
    path, and DuckDB's own error, handle it)."""
    key_sql = [unqualified(k).sql(dialect="duckdb") for k in keys]

    def swap(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.AggFunc):
            return merges[unqualified(node).sql(dialect="duckdb")].copy()
        if isinstance(node, (exp.Column, exp.Binary, exp.Func, exp.Paren, exp.Cast, exp.Unary)) and not isinstance(
                node, exp.AggFunc):
            text = unqualified(node).sql(dialect="duckdb")
            if text in key_sql:
                return exp.column(f"__g{key_sql.index(text)}", quoted=True)
        return node

    final = select.copy()
    if len(names) != len(final.expressions):
        return None
    items = []
    for item, name in zip(final.expressions, names):  # each output keeps the name DuckDB gives it
        inner = item.this if isinstance(item, exp.Alias) else item
        items.append(exp.alias_(inner.transform(swap), name, quoted=True))
    final.set("expressions", items)
    for part in ("having", "order"):
        value = final.args.get(part)
        if value is not None:
            final.set(part, value.transform(swap))
    final.set("where", None)
    final.set("group", exp.Group(expressions=[exp.column(f"__g{i}", quoted=True) for i in range(len(keys))])
              if keys else None)
    final.set("from_", exp.From(this=exp.to_table(relation)))
    for col in final.find_all(exp.Column):
        if not col.name.startswith(("__g", "__a")) and not is_output_alias(col, select):
            return None
    return final


def _only_count_stars(select: exp.Select) -> bool:
    return all(isinstance(s.parent, exp.Count) for s in select.find_all(exp.Star)) and not select.find(
        exp.Window, exp.Subquery, exp.Exists, exp.Lambda, exp.Columns)


def is_output_alias(col: exp.Column, select: exp.Select) -> bool:
    """Whether ``col`` names an alias of ``select``'s list (ORDER BY or HAVING may read one)."""
    if col.table:
        return False
    return any(isinstance(i, exp.Alias) and i.alias.lower() == col.name.lower() for i in select.expressions)
