"""Planning: a bound statement → per store reference, the IQv2 calls and the owners' SQL;
and the statement the receiver runs in DuckDB over what they return."""

from __future__ import annotations

import datetime as dt
import decimal
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

import pyarrow as pa
import sqlglot
from sqlglot import exp
from sqlglot.errors import OptimizeError, ParseError
from sqlglot.optimizer.scope import traverse_scope

from federator.catalog.definition import StoreDefinition
from federator.plan.keys import SubQuery, plan_store_queries
from federator.plugin.rules import BOUND_PARAMETER, RulePlan, SqlRule, first_plan
from federator.sql.catalog_tables import CATALOG, STORE_SCHEMAS, unqualify_store_columns
from federator.errors import SqlError
from federator.sql import pushdown
from federator.sql.copartition import co_join
from federator.sql.finish import Finish, merge_states, top_rows
from federator.sql.writeback import Source, Span, prefix_span, table_span
from federator.owner.duck_types import wire_schema
from federator.owner.work import ROWS
from federator.query.owner_work import KeyJoin, OwnerWork

# Schemas DuckDB answers itself (its catalog views); everything else names a store.
DUCKDB_SCHEMAS = {"pg_catalog"}

_Plan = TypeVar("_Plan", "StoreRef", "QueryPlan")


@dataclass
class StoreRef:
    """One store read somewhere in the statement."""

    store: StoreDefinition
    relation: str  # its name in the receiver's DuckDB
    subqueries: list[SubQuery]
    work: OwnerWork
    notes: list[str] = field(default_factory=list)
    # what the owners return, typed as the receiver's DuckDB reads it (federator.owner.duck_types;
    # their Arrow is its wire_schema); None: the store's columns
    rows_schema: pa.Schema | None = None
    combine: Callable[..., pa.Table] | None = None  # a rule that builds the rows itself
    remaining: exp.Expression | None = None  # with combine: the SQL over its rows, in place of the SELECT
    joined: str | None = None  # a co-partitioned join: the other store, read by the same owners
    key_join: KeyJoin | None = None  # with joined: the join as a lookup in Arrow, in place of work's join
    source_schema: pa.Schema | None = None  # the rows the owner's SQL reads (None: the store's)
    rebind: Callable[[list[exp.Expression]], RulePlan | None] | None = None  # with combine: RulePlan.rebind
    keep_answers: bool = False  # RulePlan.keep_answers: the subqueries' answers kept per partition

    @property
    def source(self) -> pa.Schema:
        return self.source_schema or self.store.arrow_schema()


@dataclass
class LocalRef:
    """A table this node makes from its catalog (information_schema)."""

    relation: str
    table: pa.Table


@dataclass
class QueryPlan:
    sql: str  # what the receiver runs in DuckDB
    refs: list[StoreRef]
    local: list[LocalRef]
    notes: list[str] = field(default_factory=list)
    # (relation column, output name) when the statement only picks columns of one store's rows,
    # every filter having run on the owners: the receiver answers with those columns as they came
    columns_only: list[tuple[str, str]] | None = None
    schema: pa.Schema | None = None  # the answer's schema, as DuckDB gives it
    # no volatile function (random(), now(), ...): the same rows always give the same answer
    deterministic: bool = True
    # the receiver's last step in Arrow where it can be (a merge of states, a top-k cut) instead
    # of the DuckDB statement ``sql``, which runs when the finish declines
    finish: Finish | None = None
    # this plan for other values of the statement's parameters (one planning per SQL text),
    # where only a rule's calls depend on them; None where more does
    rebind: Callable[[list[Any]], "QueryPlan | None"] | None = None
    # the plan this one was rebound from (None: planned itself); what answers are kept under
    origin: "QueryPlan | None" = None

    @property
    def identity(self) -> "QueryPlan":
        """The plan answers kept for this one were computed under: this plan, or the one it was
        rebound from (which stands while the stores it read are the same)."""
        return self.origin if self.origin is not None else self


def bind_parameters(tree: exp.Expression, params: list[Any], expected: int) -> exp.Expression:
    """A copy of ``tree`` (the planner's to change) with each placeholder replaced by its
    parameter as a literal."""
    if len(params) != expected:
        raise SqlError(
            "INVALID_PARAMETER",
            f"the SQL has {expected} placeholder(s) but {len(params)} parameter(s) were given",
        )
    if not expected:
        return tree.copy()

    def value(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Placeholder):
            bound = literal(params[node.meta["param_index"]], node.meta["param_index"])
            bound.meta[BOUND_PARAMETER] = node.meta["param_index"]  # what a rule's rebind reads
            return bound
        return node

    bound = tree.copy()
    lists: dict[tuple[int, str], exp.Expression] = {}
    for node in list(bound.find_all(exp.Placeholder, bfs=False)):
        parent, key = node.parent, node.arg_key
        if parent is not None and isinstance(parent.args.get(key), list):
            lists[(id(parent), key)] = parent  # set each list once: sqlglot walks a list on every change
        else:
            node.replace(value(node))
    for (_, key), parent in lists.items():
        parent.set(key, [value(item) for item in parent.args[key]])
    return bound


def literal(value: Any, index: int = 0) -> exp.Expression:
    """A parameter as a literal of the type DuckDB would bind it to: str VARCHAR, int an
    integer literal, float DOUBLE (a bare 2.5 would be DECIMAL), datetimes, dates, times,
    decimals and bytes as literals of their own types."""
    if value is None or isinstance(value, (bool, str, int)):
        return exp.convert(value)
    if isinstance(value, float):
        return exp.cast(exp.Literal.string(repr(value)), "DOUBLE")
    # the Postgres protocol binds typed values: each as DuckDB's literal of its type
    if isinstance(value, dt.datetime):
        return exp.cast(exp.Literal.string(value.isoformat(sep=" ")), "TIMESTAMPTZ" if value.tzinfo else "TIMESTAMP")
    if isinstance(value, (dt.date, dt.time)):
        return exp.cast(exp.Literal.string(value.isoformat()), "DATE" if isinstance(value, dt.date) else "TIME")
    if isinstance(value, decimal.Decimal) and value.is_finite():
        exponent = value.as_tuple().exponent
        scale = max(0, -exponent) if isinstance(exponent, int) else 0
        width = min(38, max(len(value.as_tuple().digits), scale + 1))
        if scale <= width:
            return exp.cast(exp.Literal.string(str(value)), f"DECIMAL({width},{scale})")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return exp.Anonymous(this="unhex", expressions=[exp.Literal.string(bytes(value).hex())])
    raise SqlError("INVALID_PARAMETER", f"parameter {index + 1} is {type(value).__name__}; "
                                        "parameters are strings, numbers, booleans, datetimes, decimals, bytes or null")


Resolver = Callable[[str], StoreDefinition]
LocalTables = Callable[[str], "pa.Table | None"]


def plan_query(tree: exp.Expression, resolve: Resolver, information_schema: LocalTables,
               rules: list[SqlRule], schema_of: Callable[[str, dict[str, pa.Table]], pa.Schema],
               copartitioned: bool = True, source: Source | None = None) -> QueryPlan:
    """Plan ``tree`` (parameters bound; a copy it may change, as ``bind_parameters`` gives).
    ``schema_of(sql, relations)`` binds SQL over empty relations in DuckDB and returns its
    answer's schema, typed as federator.owner.duck_types.typed_schema says (and raises
    DuckDB's errors). ``copartitioned``: run joins of co-partitioned stores on their owners
    where possible. ``source``: the text ``tree`` was read from, which the receiver runs with
    its tables renamed (None: sqlglot writes the tree back)."""
    _refuse_engine_introspection(tree)
    # the user's text loses the schema of schema.store.column as the tree does
    unqualified = [(prefix_span(first, name), "") for first, name in unqualify_store_columns(tree)]
    if copartitioned and isinstance(tree, exp.Select):
        joined = _plan_co_join(tree, resolve, schema_of, source, unqualified)
        if joined is not None:
            return joined
    read = _read_tables(tree, resolve, information_schema, rules, unqualified)
    refs, local, empty, renamed = read.refs, read.local, read.empty, read.renamed
    replaced: list[tuple[exp.Expression, exp.Expression]] = []
    for ref, table, query in read.planned:
        if ref.combine is not None:
            replaced.append((query, _rule_select(ref, table)))
        renamed.append((table_span(table), _rename(table, ref.relation)))
        empty[ref.relation] = (ref.rows_schema or ref.store.arrow_schema()).empty_table()
    for old, new in replaced:
        if old is tree:
            tree = new
        else:
            old.replace(new)
    if replaced:  # a rule's SQL may read its rows in place of another reference's (a player's rank in a CTE)
        read_now = {t.name.lower() for t in tree.find_all(exp.Table)}
        refs = [ref for ref in refs if ref.relation.lower() in read_now]
    planned = read.planned

    sql = _user_sql(tree, None if replaced else source, renamed)
    notes: list[str] = []
    if any(ref.combine is not None for ref in refs):  # the rule's rows exist only once fetched
        plan = _with_top_rows(QueryPlan(sql, refs, local, notes))
        if len(refs) == 1 and not local and refs[0].rebind is not None and not any(
                BOUND_PARAMETER in (node.meta or {}) for node in tree.walk() if node._meta):
            plan.rebind = _rebinder(plan)  # the parameters reach the rule's calls alone
        return plan
    answer = schema_of(sql, empty)  # DuckDB's binder errors, with the user's own names
    names = answer.names
    # One store read by the whole statement: partial aggregates on the owners.
    if len(planned) == 1 and not local and isinstance(tree, exp.Select) and planned[0][2] is tree:
        ref, table, _ = planned[0]
        merged = _partial_aggregate(ref, table, tree, answer, schema_of, notes)
        if merged is not None:
            return QueryPlan(merged, refs, local, notes, schema=wire_schema(answer), finish=_merge_finish(merged, ref))
        columns_only = _columns_only(tree, ref, table, names)
        plan = QueryPlan(sql, refs, local, notes, columns_only, wire_schema(answer))
        return plan if columns_only is not None else _with_top_rows(plan)
    return QueryPlan(sql, refs, local, notes)


@dataclass
class _Read:
    """What a statement reads: its store references (each with its table and the query that
    reads it), the catalog's tables it reads here, each relation's empty table to bind
    against, and the renames of the user's text (each table's name in the text, and its
    relation; each column's qualifier, and nothing)."""

    refs: list[StoreRef] = field(default_factory=list)
    local: list[LocalRef] = field(default_factory=list)
    empty: dict[str, pa.Table] = field(default_factory=dict)
    planned: list[tuple[StoreRef, exp.Table, exp.Expression]] = field(default_factory=list)
    renamed: list[tuple[tuple[int, int] | None, str]] = field(default_factory=list)


def _tables(tree: exp.Expression) -> list[tuple[exp.Table, exp.Expression]]:
    """Every table ``tree`` reads, once, with the query that reads it."""
    try:
        scopes = traverse_scope(tree)
    except OptimizeError as e:
        raise SqlError("SQL_PARSE_ERROR", f"cannot resolve the query's names: {e}") from None
    seen: set[int] = set()
    tables: list[tuple[exp.Table, exp.Expression]] = []
    for scope in scopes:
        for read in scope.sources.values():
            if isinstance(read, exp.Table) and id(read) not in seen and isinstance(read.this, exp.Identifier):
                seen.add(id(read))
                tables.append((read, scope.expression))
    return tables


def _read_tables(tree: exp.Expression, resolve: Resolver, information_schema: LocalTables, rules: list[SqlRule],
                 unqualified: list[tuple[tuple[int, int] | None, str]]) -> _Read:
    """Each table ``tree`` reads planned: a store's reference, or a catalog table read here
    (DuckDB's own schemas are left to it); UNKNOWN_STORE for a catalog or schema that is not."""
    mentioned = pushdown.named(tree)
    read = _Read(renamed=list(unqualified))
    used: dict[str, int] = {}
    for table, query in _tables(tree):
        db, catalog = (table.db or "").lower(), (table.catalog or "").lower()
        if catalog and catalog != CATALOG:
            raise SqlError("UNKNOWN_STORE", f"unknown catalog {table.catalog!r}; the one catalog is {CATALOG!r}")
        if db in DUCKDB_SCHEMAS:
            continue
        if db == "information_schema":
            made = information_schema(table.name.lower())
            if made is None:
                raise SqlError("UNKNOWN_STORE", f"information_schema has tables and columns, not {table.name!r}")
            relation = _relation(f"information_schema_{table.name.lower()}", used)
            read.local.append(LocalRef(relation, made))
            read.empty[relation] = made.schema.empty_table()
            read.renamed.append((table_span(table), _rename(table, relation)))
            continue
        if db and db not in STORE_SCHEMAS:
            raise SqlError("UNKNOWN_STORE", f"unknown schema {table.db!r}; stores live in the schema "
                                            f"{' or '.join(map(repr, STORE_SCHEMAS))}")
        defn = resolve(table.name)
        ref = _plan_ref(defn, table, query, mentioned, rules, _relation(defn.name, used))
        read.refs.append(ref)
        read.planned.append((ref, table, query))
    return read


def _rule_select(ref: StoreRef, table: exp.Table) -> exp.Expression:
    """The rule's SQL over its rows (or the rows as they are): what takes the SELECT's place."""
    new = ref.remaining.copy() if ref.remaining is not None else exp.select("*").from_(exp.to_table(ref.relation))
    for t in new.find_all(exp.Table):
        if t.name.lower() == table.name.lower():
            _rename(t, ref.relation)
    return new


def _user_sql(tree: exp.Expression, source: Source | None, renamed: list[tuple[tuple[int, int] | None, str]]) -> str:
    """What the receiver's DuckDB runs: the user's text with its tables renamed (``renamed``:
    where each table's name is, and what takes its place), or the tree written back where
    the text cannot be."""
    spans: list[Span] = [(*at, new) for at, new in renamed if at is not None]
    if source is None or len(spans) != len(renamed):
        return tree.sql(dialect="duckdb")
    return source.written(spans)


def _rebinder(plan: QueryPlan) -> Callable[[list[Any]], QueryPlan | None]:
    (ref,) = plan.refs
    rebind = ref.rebind
    assert rebind is not None

    def rebound(params: list[Any]) -> QueryPlan | None:
        ruled = rebind([literal(p, i) for i, p in enumerate(params)])
        if ruled is None or ruled.combine is None:
            return None
        rebound_ref = _copied(ref, subqueries=ruled.subqueries, combine=ruled.combine)
        return _copied(plan, refs=[rebound_ref], origin=plan)
    return rebound


def _copied(plan: _Plan, **changed: Any) -> _Plan:
    """A shallow copy of a plan's dataclass with the ``changed`` fields set: not
    dataclasses.replace, which runs __init__ over every field, nor copy.copy, which goes by
    __reduce_ex__; each rebinding (a global leaderboard's rank) makes two."""
    new = object.__new__(type(plan))
    new.__dict__.update(plan.__dict__, **changed)
    return new


def _merge_finish(final: str, ref: StoreRef) -> Finish | None:
    """The receiver's merge of the owners' states in Arrow, read from its statement ``final``
    as DuckDB reads it."""
    try:
        return merge_states(sqlglot.parse_one(final, read="duckdb"), ref.relation)
    except ParseError:
        return None


def _with_top_rows(plan: QueryPlan) -> QueryPlan:
    """``plan`` with its receiver's ORDER BY ... LIMIT cut in Arrow, where its statement is only that
    over one store's rows (the statement as DuckDB will read it: its NULLS order is the
    dialect's)."""
    if len(plan.refs) != 1 or plan.local:
        return plan
    try:
        tree = sqlglot.parse_one(plan.sql, read="duckdb")
    except ParseError:
        return plan
    plan.finish = top_rows(tree, plan.refs[0].relation)
    return plan


def _columns_only(select: exp.Select, ref: StoreRef, table: exp.Table, names: list[str]) -> list[tuple[str, str]] | None:
    """The columns ``select`` picks, when that is all it does over rows the owners filtered."""
    if ref.combine is not None or ref.work.kind not in ("columns", "filter"):
        return None
    if any(select.args.get(k) for k in ("joins", "group", "having", "order", "limit", "offset", "distinct",
                                        "qualify", "with_", "with", "windows", "sample", "laterals")):
        return None
    where = select.args.get("where")
    columns = {f.name.lower() for f in ref.store.arrow_schema()}
    if where is not None and not all(pushdown.only_reads(c, table.alias_or_name, columns, True)
                                     for c in pushdown.conjuncts(where.this)):
        return None
    kept = list((ref.rows_schema or ref.store.arrow_schema()).names)
    by_lower = {c.lower(): c for c in kept}
    picked: list[str] = []
    for item in select.expressions:
        node = item.this if isinstance(item, exp.Alias) else item
        if isinstance(node, exp.Star) and not any(node.args.get(k) for k in ("except", "except_", "replace", "rename")):
            picked += kept
        elif isinstance(node, exp.Column) and isinstance(node.this, exp.Identifier) and \
                (not node.table or node.table.lower() == table.alias_or_name.lower()) and node.name.lower() in by_lower:
            picked.append(by_lower[node.name.lower()])
        else:
            return None
    if len(picked) != len(names):
        return None
    return list(zip(picked, names))


# DuckDB's own settings, files and catalog of the node: the sandbox keeps them to itself
# (they name paths under the state dir, memory, extensions).
_INTROSPECTION = {"current_setting", "duckdb_settings", "duckdb_extensions", "duckdb_secrets", "which_secret",
                  "duckdb_temporary_files", "duckdb_memory", "duckdb_databases", "duckdb_external_file_cache",
                  "duckdb_log_contexts", "duckdb_logs", "duckdb_variables", "getvariable", "duckdb_prepared_statements"}


def _refuse_engine_introspection(tree: exp.Expression) -> None:
    for node in tree.find_all(exp.Anonymous):
        name = str(node.this).lower()
        if name in _INTROSPECTION or name.startswith("pragma_"):
            raise SqlError("UNSUPPORTED", f"{name}() reads the node's own engine settings and files, which "
                                          "Federator does not expose; query the stores, information_schema or "
                                          "GET /v1/metadata instead")


def _partial_aggregate(ref: StoreRef, table: exp.Table, tree: exp.Select, answer: pa.Schema,
                       schema_of: Callable[[str, dict[str, pa.Table]], pa.Schema], notes: list[str]) -> str | None:
    """Split ``tree``'s aggregates into the owners' partial states and their merge: the merge's
    SQL; None where the merge would not answer with ``answer``'s types (DuckDB's for the
    whole statement: a HUGEINT sum stays one), or the owners could not compute the states."""
    columns = {f.name.lower() for f in ref.source}
    split = pushdown.partial_aggregate(tree, table, columns, ref.relation, answer.names)
    if split is None:
        return None
    owner_sql = split.owner_select.sql(dialect="duckdb")
    final = split.final.sql(dialect="duckdb")
    try:
        states = schema_of(owner_sql, {ROWS: ref.source.empty_table()})
        merged = schema_of(final, {ref.relation: states.empty_table()})
    except SqlError:  # a state DuckDB has no function for (the SUM of an AVG of timestamps)
        return None
    if merged.types != answer.types:
        return None
    ref.rows_schema = states
    ref.work = OwnerWork(ref.work.columns, owner_sql, "partial aggregate")
    notes.append("final aggregate over the partitions' states")
    return final


def _plan_co_join(tree: exp.Select, resolve: Resolver, schema_of: Callable[[str, dict[str, pa.Table]], pa.Schema],
                  source: Source | None, unqualified: list[tuple[tuple[int, int] | None, str]]) -> QueryPlan | None:
    """``tree`` as a join of co-partitioned stores run on the owners, or None when it is not one;
    ``unqualified``: the column qualifiers to take off the user's text."""

    def known(name: str) -> StoreDefinition | None:
        try:
            return resolve(name)
        except SqlError:
            return None

    relation = "joined"
    cj = co_join(tree, known, pushdown.named(tree), relation)
    if cj is None:
        return None
    # the user's statement over the two stores first: DuckDB's errors and output names are its own
    original = tree.copy()
    first = tree.args["from_"].this.name.lower()

    def store_of(t: exp.Table) -> StoreDefinition:  # the statement's first table is cj.left unless swapped
        return cj.left if (t.name.lower() == first) != cj.swapped else cj.right

    renamed = unqualified + [(table_span(t), _rename(t, store_of(t).name)) for t in list(original.find_all(exp.Table))]
    mentioned = pushdown.named(tree)
    answer = schema_of(_user_sql(original, source, renamed),
                       {d.name: _readable(d, mentioned).empty_table() for d in (cj.left, cj.right)})
    names = answer.names
    select = cj.select
    if len(names) == len(select.expressions):
        select.set("expressions", [exp.alias_(i.this if isinstance(i, exp.Alias) else i, n, quoted=True)
                                   for i, n in zip(select.expressions, names)])
    flat = {n.lower() for n in cj.schema.names}
    ref = _plan_ref(cj.left, cj.table, select, flat, [], relation, source=cj.schema)
    ref.subqueries = plan_store_queries(cj.left, cj.left_keys, [])
    ref.joined = cj.right.name
    ref.source_schema = cj.schema
    notes = [f"join with global store {cj.right.name} on the owners of {cj.left.name}" if cj.broadcast
             else f"join of co-partitioned {cj.left.name} and {cj.right.name} on the nodes that own both"]
    ref.notes.append(notes[0])
    sql = select.sql(dialect="duckdb")
    merged = _partial_aggregate(ref, cj.table, select, answer, schema_of, notes)
    final = merged or sql
    owner = ref.work.sql or exp.select(*[exp.column(c, quoted=True) for c in ref.work.columns]).from_(ROWS).sql(
        dialect="duckdb")
    if cj.lookup is not None:
        ref.key_join = KeyJoin(*cj.lookup, cj.join_sql, owner, None if ref.work.sql else ref.work.columns,
                               ref.work.kind)
    ref.work = OwnerWork(ref.work.columns, f"WITH {ROWS} AS ({cj.join_sql}) {owner}", "join, " + ref.work.kind)
    if ref.rows_schema is None:
        ref.rows_schema = pa.schema([cj.schema.field(c) for c in ref.work.columns])
    if schema_of(final, {relation: ref.rows_schema.empty_table()}).types != answer.types:
        return None  # the join's rows do not give the statement's types: the receiver joins them
    return QueryPlan(final, [ref], [], notes, schema=wire_schema(answer),
                     finish=_merge_finish(merged, ref) if merged is not None else None)


def _readable(defn: StoreDefinition, mentioned: set[str]) -> pa.Schema:
    """The store's columns a statement reads as its own: rowtime, a pseudo-column (like
    ksqlDB's ROWTIME), only when named."""
    return pa.schema([f for f in defn.arrow_schema() if f.name != "rowtime" or "rowtime" in mentioned])


def _relation(name: str, used: dict[str, int]) -> str:
    n = used.get(name.lower(), 0) + 1
    used[name.lower()] = n
    return name if n == 1 else f"{name}__{n}"


def _rename(table: exp.Table, relation: str) -> str:
    """Point ``table`` at the relation registered for it; its columns keep their qualifier.
    Returns the text that takes the place of its name (catalog and schema included)."""
    alias = table.alias_or_name
    table.set("this", exp.to_identifier(relation, quoted=True))
    table.set("db", None)
    table.set("catalog", None)
    new = exp.to_identifier(relation, quoted=True).sql(dialect="duckdb")
    if alias.lower() != relation.lower() and not table.alias:
        table.set("alias", exp.TableAlias(this=exp.to_identifier(alias, quoted=True)))
        new += " AS " + exp.to_identifier(alias, quoted=True).sql(dialect="duckdb")
    return new


def _plan_ref(defn: StoreDefinition, table: exp.Table, query: exp.Expression, mentioned: set[str],
              rules: list[SqlRule], relation: str, source: pa.Schema | None = None) -> StoreRef:
    schema = source or defn.arrow_schema()
    columns = {f.name.lower() for f in schema}
    select = query if isinstance(query, exp.Select) else None
    conds = pushdown.pushable_filter(select, table, columns) if select is not None else []
    where = pushdown.and_all([pushdown.unqualified(c) for c in conds])
    # rowtime is a pseudo-column (like ksqlDB's ROWTIME): read when named, not part of *
    everything = select is None or pushdown.reads_everything(select, table)
    keep = tuple(f.name for f in schema if (everything and f.name != "rowtime") or f.name.lower() in mentioned)
    keep = keep or (defn.key_name if source is None else schema[0].name,)  # COUNT(*) still needs the rows
    notes: list[str] = []
    rule: RulePlan | None = None
    single = select is not None and not select.args.get("joins")
    if single:
        ruled = first_plan(rules, select, defn)
        if ruled is not None:
            rule = ruled[1]
            notes.append(f"rule {ruled[0].name}: {rule.note}")
    if rule is not None and rule.combine is not None:
        return StoreRef(defn, relation, rule.subqueries, OwnerWork(tuple(f.name for f in schema)), notes,
                        combine=rule.combine, remaining=rule.remaining, rebind=rule.rebind)
    subqueries = rule.subqueries if rule is not None else plan_store_queries(defn, where, [])
    sql_parts = []
    kind = "columns"
    top = pushdown.top_k(select, table, columns) if single and select is not None and not (
        rule is not None and rule.rows_are_top_k) else None
    if where is not None or top is not None:
        q = exp.select(*[exp.column(c, quoted=True) for c in keep]).from_(ROWS)
        if where is not None:
            q = q.where(where, copy=False)
            kind = "filter"
        if top is not None:
            q = (q.order_by(*top[0]) if top[0] else q).limit(top[1])
            kind = "top-k" if where is None else "filter, top-k"
        sql_parts.append(q.sql(dialect="duckdb", copy=False))  # q is ours alone: no copy of a long IN list
    work = OwnerWork(keep, sql_parts[0] if sql_parts else None, kind)
    rows_schema = pa.schema([schema.field(c) for c in keep])
    return StoreRef(defn, relation, subqueries, work, notes, rows_schema,
                    keep_answers=rule is not None and rule.keep_answers)
