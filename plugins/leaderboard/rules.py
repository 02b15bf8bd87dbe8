"""SQL shapes the leaderboard answers with its own queries, each answered by the partitions'
order-statistics indexes (federator_plugins.leaderboard.index) in O(log n).

- ``SELECT ... FROM lb ORDER BY score DESC LIMIT k`` (no WHERE, no GROUP BY): a TopKQuery
  per partition, and the usual ORDER BY + LIMIT over what comes back.
- Ranks, ``RANK()``, ``DENSE_RANK()`` or ``ROW_NUMBER() OVER (ORDER BY score DESC|ASC [, player
  ASC|DESC])`` (ROW_NUMBER only with the key breaking ties: without it DuckDB numbers tied rows
  in no set order), selected with one of three QUALIFY clauses (DuckDB and others run them as
  they are):
  - ``QUALIFY player = ?`` (``IN (...)`` for several): players one partition holds are ranked
    there from one read (PlacesQuery), and in the other partitions from their whole scores,
    kept by the node asked while they have not moved (ScoresQuery), or where those are too many
    or ties are broken by the key, by each partition's count (RankQuery). Players of several
    partitions: their scores (KeysQuery), then every partition counts the rows that rank
    before them (RankQuery), summed. DENSE_RANK merges distinct better scores instead, as
    distinct counts do not add up.
  - ``QUALIFY rank <= k`` (``<``, ``=``, ``BETWEEN``; with other filters beside it): each
    partition's best rows down to rank k (TopKQuery; DENSE_RANK: its k best scores), which
    hold every row ranked k or better and every row better than those, so DuckDB ranks them
    exactly: top-k with ties.
  - the players around one: ``WITH me AS (<that player's rank, QUALIFY player = ?>) SELECT ...
    QUALIFY rank BETWEEN (SELECT rank FROM me) - a AND (SELECT rank FROM me) + b``: the
    player's score, then each partition's rows near it (AroundQuery) and how many rank before
    them, from which every row that can be in the range is ranked exactly.

On a global leaderboard the node asked holds every partition, and reads the players' scores
and what it ranks them from in one read (PlayerRanksQuery, RanksAroundQuery, TopKQuery).

A rank read in two rounds is of one state where it matters: a partition's count and the rows
of the players it holds come from one read (the second round reads the players' rows again
beside the counts, and is asked again if a write moved a player in between).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from sortedcontainers import SortedList
from sqlglot import exp
from sqlglot.optimizer.eliminate_ctes import eliminate_ctes

from federator.catalog.definition import StoreDefinition
from federator.errors import SqlError
from federator.partitioner import partition_for
from federator.plan.keys import SubQuery
from federator.plugin.rules import Fetch, RulePlan, SqlRule, is_plain_column, literal, parameter_of
from federator.query.queries import KeysQuery
from federator.query.rows import Rows, as_batch, concat_rows

from federator_plugins.leaderboard.index import Order, before, key_order, score_of
from federator_plugins.leaderboard.queries import (AroundQuery, PlacesQuery, PlayerRanksQuery, RankQuery,
                                                   RanksAroundQuery, ScoresQuery, TopKQuery)
from federator_plugins.leaderboard.store import (ANCHOR, AFTER, BEFORE, COUNT, ENTRY, PLACE, RANK, ROWS, SCORE,
                                                  ranked_schema, sortable_score)

RANK_COLUMN = RANK  # the rank the rule computed, as PlayerRanksQuery and RanksAroundQuery name it too
ANCHOR_COLUMN = ANCHOR  # the player's rank the rows around it are chosen by, as RanksAroundQuery names it
TRIES = 20  # second rounds asked again because writes kept moving the players in between
# a partition's scores sent whole to the node asked, which keeps them while the partition has not
# moved and counts ranks from them, up to this many rows (128 KiB); a larger one counts for itself
LISTED_SCORES = 16_384
_FUNCTIONS = {exp.Rank: "rank", exp.DenseRank: "dense", exp.RowNumber: "row"}


def _together(store: StoreDefinition) -> str:
    """What EXPLAIN adds where a global store answers a query from every partition at once."""
    return ", merged in one read on the node asked (a global store)" if store.is_global else ""


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
            f"top {k} by {_score_column(store)} {'DESC' if descending else 'ASC'} from each partition's score index"
            + _together(store),
            rows_are_top_k=True,  # each partition's top k with the ties at the cut: the receiver's cut is exact
            keep_answers=True,  # a partition's top k is its state's: after a write only the moved partition is read
        )


@dataclass(frozen=True)
class Ranking:
    """The window a statement ranks by: its function ("rank", "dense" or "row") and order."""

    function: str
    order: Order
    window: exp.Window
    alias: str | None  # the select item's name for it

    @property
    def dense(self) -> bool:
        return self.function == "dense" and self.order.tie_key is None  # with the key, ranks are row numbers

    def is_rank(self, node: exp.Expression) -> bool:
        """Whether ``node`` reads the rank: the alias, or the window written out again."""
        if isinstance(node, exp.Column) and not node.table and self.alias is not None:
            return node.name.lower() == self.alias.lower()
        return isinstance(node, exp.Window) and node == self.window


def ranking(select: exp.Select, store: StoreDefinition) -> Ranking | None:
    """The one ranking window ``select`` computes over ``store``, where the rule can answer it."""
    if any(select.args.get(a) for a in ("where", "group", "having", "distinct", "joins")):
        return None
    windows = [w for w in select.find_all(exp.Window) if w.find_ancestor(exp.Select) is select]
    if not windows:
        return None
    window = windows[0]
    function = _FUNCTIONS.get(type(window.this))
    order = window.args.get("order")
    if function is None or window.args.get("partition_by") or window.args.get("spec") or order is None \
            or any(w != window for w in windows):
        return None
    items = order.expressions
    if not 1 <= len(items) <= 2 or not is_plain_column(items[0].this, _score_column(store)):
        return None
    tie_key = None
    if len(items) == 2:
        if not is_plain_column(items[1].this, store.key_name) or store.key_format not in ("string", "bytes", "long", "int"):
            return None
        tie_key = "desc" if items[1].args.get("desc") else "asc"
    if function == "row" and tie_key is None:
        return None  # DuckDB numbers tied rows in no set order: its answer is not one to be equal to
    alias = None
    for item in select.expressions:
        if item is window or item.this is window:
            alias = item.alias if isinstance(item, exp.Alias) else None
        elif item.find(exp.Window):
            return None  # the rank inside a larger expression: leave it to the general path
    return Ranking(function, Order(bool(items[0].args.get("desc")), tie_key), window, alias)


class RankRule(SqlRule):
    name = "leaderboard.rank"
    store_types = ("leaderboard",)

    def plan(self, select: exp.Select, store: StoreDefinition) -> RulePlan | None:
        ranked = ranking(select, store)
        qualify = select.args.get("qualify")
        if ranked is None or qualify is None:
            return None
        named = _players(qualify.this, store)
        if named is not None:
            if ranked.window.find_ancestor(exp.Qualify) is not None:
                return None
            return _players_plan(named, ranked, store, _with_rank_column(select, ranked, drop_qualify=True))
        k = _rank_bound(qualify.this, ranked)
        if k is not None:
            return RulePlan(
                [SubQuery(TopKQuery(k, ranked.order.descending, ranked.dense), None)],
                f"each partition's rows down to rank {k} (its {'best scores' if ranked.dense else 'best rows'} "
                "from its score index), ranked over them all" + _together(store))
        return _around_plan(select, qualify.this, ranked, store)


def _with_rank_column(select: exp.Select, ranked: Ranking, drop_qualify: bool) -> exp.Select:
    """``select`` reading the rank from the rule's column, not computing it."""
    remaining = select.copy()
    if drop_qualify:
        remaining.set("qualify", None)
    for node in list(remaining.find_all(exp.Window)):
        replacement = exp.column(RANK_COLUMN)
        if not isinstance(node.parent, (exp.Alias, exp.Qualify)) and node.find_ancestor(exp.Qualify) is None:
            replacement = exp.alias_(replacement, ranked.window.sql(dialect="duckdb"), quoted=True)
        node.replace(replacement)
    return remaining


# ---- the players' ranks ----------------------------------------------------------------------

def _players_plan(named: list[exp.Expression], ranked: Ranking, store: StoreDefinition,
                  remaining: exp.Select | None) -> RulePlan | None:
    """Ranks the players ``named`` (literals): for the statement as bound, and again for other
    values of its parameters (``rebind``), which change nothing else."""
    try:
        players = tuple(dict.fromkeys(store.key.coerce(literal(node)) for node in named))
    except (ValueError, TypeError):
        return None
    if store.is_global:
        return _together_plan(players, named, ranked, store, remaining)
    by_partition = tuple(sorted({partition_for(store.key.serialize(k), store.partitions) for k in players}))
    if len(by_partition) == 1:
        return _home_plan(players, by_partition[0], named, ranked, store, remaining)
    lookups = [SubQuery(KeysQuery(players), by_partition)]

    def combine(fetch: Fetch) -> pa.Table:
        rows = _table(fetch(lookups), store)
        for _ in range(TRIES):
            query = _rank_query(rows, players, ranked, store)
            if not query.scores:
                return rows.append_column(RANK_COLUMN, pa.array([], pa.int64()))
            now, said = _split(fetch([SubQuery(query, None)]), store)
            if _places(now, store) == _places(rows, store):
                keys = rows.column(store.key_name).to_pylist()  # the players in the order of query's places
                return now.append_column(RANK_COLUMN, _ranks(now, said, keys, query, ranked, store))
            rows = now  # a write moved a player between the rounds: count again from its new score
        raise _kept_moving(store)

    def rebind(parameters: list[exp.Expression]) -> RulePlan | None:
        return _players_plan([_rebound(node, parameters) for node in named], ranked, store, None)

    what = "distinct better scores" if ranked.dense else "rows that rank before them"
    return RulePlan(
        [*lookups, SubQuery(RankQuery(players, (), (), ranked.order.descending, ranked.order.tie_key,
                                      ranked.dense), None)],
        f"read the players' scores, then count the {what} in every partition's score index "
        "(reading the players again beside the counts)",
        combine=combine, remaining=remaining, rebind=rebind)


def _home_plan(players: tuple, home: int, named: list[exp.Expression], ranked: Ranking, store: StoreDefinition,
               remaining: exp.Select | None) -> RulePlan:
    """Ranks players that one partition (``home``) holds: it says their rows and what ranks
    before them there, from one read (PlacesQuery); the other partitions' scores, sent whole
    while small and kept while they have not moved (ScoresQuery), are counted here, so a rank
    asked again makes one call. Where they are not (too many rows, a tie broken by the key, no
    answers kept), each other partition counts what ranks before the players' scores (RankQuery):
    their rows are not in it, so no write there can move them between the two rounds."""
    here = [SubQuery(PlacesQuery(players, ranked.order.descending, ranked.order.tie_key, ranked.dense), (home,))]
    others = tuple(p for p in range(store.partitions) if p != home)
    listed = [SubQuery(ScoresQuery(LISTED_SCORES), others)]

    def combine(fetch: Fetch) -> pa.Table:
        rows, said = _split(fetch(here), store)
        if not rows.num_rows:
            return rows.append_column(RANK_COLUMN, pa.array([], pa.int64()))
        scores = rows.column(_score_column(store)).to_pylist()
        places = np.array([sortable_score(store, s) for s in scores], np.uint64)
        lists = _listed_scores(fetch, listed) if others and ranked.order.tie_key is None and fetch.keeps \
            and max(said.column(ROWS).drop_null().to_pylist()) <= LISTED_SCORES else None
        counted = [said]
        if lists is None and others:
            keys = tuple(rows.column(store.key_name).to_pylist()) if ranked.order.tie_key else ()
            query = RankQuery((), tuple(scores), keys, ranked.order.descending, ranked.order.tie_key, ranked.dense)
            counted.append(_split(fetch([SubQuery(query, others)]), store)[1])
        return rows.append_column(RANK_COLUMN, _counted_ranks(places, counted, lists or [], ranked))

    def rebind(parameters: list[exp.Expression]) -> RulePlan | None:
        return _players_plan([_rebound(node, parameters) for node in named], ranked, store, None)

    what = "distinct better scores" if ranked.dense else "rows that rank before them"
    return RulePlan(
        [*here, *listed],
        f"read the players' rows and count the {what} in their partition's score index, in one read; "
        f"count them here in every other partition's scores, kept while it has not moved (up to "
        f"{LISTED_SCORES:,} rows a partition; past that, or with ties broken by the key, each partition counts)",
        combine=combine, remaining=remaining, rebind=rebind)


def _listed_scores(fetch: Fetch, listed: list[SubQuery]) -> list[np.ndarray] | None:
    """Each partition's scores ``listed`` asks for (kept answers where they are current), or
    None when a partition holds too many to send."""
    columns = [b.column(0) for b in fetch(listed, keep=True)]
    return None if any(c.null_count for c in columns) else [c.to_numpy() for c in columns]


def _counted_ranks(places: np.ndarray, counted: list[pa.Table], lists: list[np.ndarray], ranked: Ranking) -> pa.Array:
    """The ranks of ``places`` (sortable scores, in the rows' order) from what partitions said
    beside their rows (``counted``: PlacesQuery's and RankQuery's) and other partitions' whole
    scores (``lists``, ascending)."""
    descending = ranked.order.descending
    if ranked.dense:
        better = np.unique(np.concatenate([t.column(SCORE).drop_null().to_numpy() for t in counted] + lists))
        mine = len(better) - np.searchsorted(better, places, side="right") if descending \
            else np.searchsorted(better, places, side="left")
    else:
        mine = sum(np.bincount(t.column(PLACE).drop_null().to_numpy(), t.column(COUNT).drop_null().to_numpy(),
                               len(places)).astype(np.int64) for t in counted)
        for scores in lists:
            mine += len(scores) - np.searchsorted(scores, places, side="right") if descending \
                else np.searchsorted(scores, places, side="left")
    return pa.array(mine + 1, pa.int64())


def _together_plan(players: tuple, named: list[exp.Expression], ranked: Ranking, store: StoreDefinition,
                   remaining: exp.Select | None) -> RulePlan:
    """A global leaderboard's players ranked in one read of every partition on the node asked."""
    ranks = [SubQuery(PlayerRanksQuery(players, ranked.order.descending, ranked.order.tie_key, ranked.dense), None)]

    def combine(fetch: Fetch) -> pa.Table | Rows:
        return _together_rows(fetch(ranks), ranked_schema(store, RANK_COLUMN))

    def rebind(parameters: list[exp.Expression]) -> RulePlan | None:
        return _players_plan([_rebound(node, parameters) for node in named], ranked, store, None)

    what = "distinct better scores" if ranked.dense else "rows that rank before them"
    return RulePlan(ranks, f"read the players' scores and count the {what} in the score index of every "
                           "partition as one, in one read on the node asked (a global store)",
                    combine=combine, remaining=remaining, rebind=rebind)


def _rank_query(rows: pa.Table, players: tuple, ranked: Ranking, store: StoreDefinition) -> RankQuery:
    keys = rows.column(store.key_name).to_pylist()
    scores = rows.column(_score_column(store)).to_pylist()
    return RankQuery(players, tuple(scores), tuple(keys) if ranked.order.tie_key else (),
                     ranked.order.descending, ranked.order.tie_key, ranked.dense)


def _places(rows: pa.Table, store: StoreDefinition) -> dict:
    """Each player's score, as the index orders it."""
    return {k: sortable_score(store, s) for k, s in zip(rows.column(store.key_name).to_pylist(),
                                                        rows.column(_score_column(store)).to_pylist())}


def _ranks(rows: pa.Table, said: pa.Table, keys: list, query: RankQuery, ranked: Ranking,
           store: StoreDefinition) -> pa.Array:
    """The ranks of ``rows`` (the players ``keys``, at ``query``'s places) from what every
    partition said beside them."""
    places = np.array([sortable_score(store, s) for s in query.scores], np.uint64)
    by_player = dict(zip(keys, _counted_ranks(places, [said], [], ranked).to_pylist()))
    return pa.array([by_player[k] for k in rows.column(store.key_name).to_pylist()], pa.int64())


def _kept_moving(store: StoreDefinition) -> SqlError:
    return SqlError("UNAVAILABLE", f"the players' scores in store {store.name!r} changed between every two reads "
                                   f"of {TRIES}; ask again")


# ---- rows down to a rank ---------------------------------------------------------------------

def _rank_bound(node: exp.Expression, ranked: Ranking) -> int | None:
    """The largest rank a QUALIFY keeps, when one of its conjuncts bounds the rank by a literal
    and the others read the row alone (no window, subquery or aggregate)."""
    bound = None
    for c in _conjuncts(node):
        k = _upper(c, ranked)
        if k is not None:
            bound = k if bound is None else min(bound, k)
        elif c.find(exp.Subquery, exp.AggFunc, exp.Select) or any(w != ranked.window for w in c.find_all(exp.Window)):
            return None
    return bound


def _upper(c: exp.Expression, ranked: Ranking) -> int | None:
    try:
        if isinstance(c, exp.Between) and ranked.is_rank(c.this):
            return int(literal(c.args["high"]))
        for op, flipped, less in ((exp.LTE, exp.GTE, 0), (exp.LT, exp.GT, 1), (exp.EQ, exp.EQ, 0)):
            if isinstance(c, op) and ranked.is_rank(c.this):
                return int(literal(c.expression)) - less
            if isinstance(c, flipped) and ranked.is_rank(c.expression):
                return int(literal(c.this)) - less
    except (ValueError, TypeError):
        return None
    return None


def _conjuncts(node: exp.Expression) -> list[exp.Expression]:
    if isinstance(node, exp.Paren):
        return _conjuncts(node.this)
    if isinstance(node, exp.And):
        return _conjuncts(node.this) + _conjuncts(node.expression)
    return [node]


# ---- the players around one ------------------------------------------------------------------

def _around_plan(select: exp.Select, node: exp.Expression, ranked: Ranking, store: StoreDefinition) -> RulePlan | None:
    """QUALIFY rank BETWEEN (SELECT rank FROM me) - a AND (SELECT rank FROM me) + b, where ``me``
    is a CTE ranking one player the same way over the same store."""
    if ranked.dense or len(_conjuncts(node)) != 1 or not isinstance(node, exp.Between) or not ranked.is_rank(node.this):
        return None
    low, high = _anchored(node.args["low"], select, ranked, store), _anchored(node.args["high"], select, ranked, store)
    if low is None or high is None or low[0] != high[0]:
        return None
    named, above, below = low[0], -low[1], high[1]
    try:
        player = store.key.coerce(literal(named))
    except (ValueError, TypeError):
        return None
    remaining = _around_remaining(select, ranked, store.is_global)
    if store.is_global:
        return _around_together_plan(player, named, above, below, ranked, store, remaining)
    owner = (partition_for(store.key.serialize(player), store.partitions),)

    def combine(fetch: Fetch) -> pa.Table:
        found = _table(fetch([SubQuery(KeysQuery((player,)), owner)]), store)
        score = sortable_score(store, found.column(_score_column(store))[0].as_py()) if found.num_rows else None
        for _ in range(TRIES):
            if score is None:
                return _ranked_rows(_table([], store), [], 0)
            windows = [_split([b], store, ENTRY) for b in fetch([SubQuery(AroundQuery(
                player, score, max(above, 0), max(below, 0), ranked.order.descending), None)])]
            now = next((s for _, said in windows for s in said.column(SCORE).to_pylist() if s is not None), None)
            if now == score:
                return _around(windows, player, score, ranked, store)
            score = now  # a write moved the player between the rounds
        raise _kept_moving(store)

    return RulePlan(
        [SubQuery(KeysQuery((player,)), owner), SubQuery(AroundQuery(player, None, above, below,
                                                                     ranked.order.descending), None)],
        f"read the player's score, then each partition's rows near it and how many rank before them "
        "(reading the player again beside them), ranked at the receiver",
        combine=combine, remaining=remaining)


def _around_together_plan(player: Any, named: exp.Expression, above: int, below: int, ranked: Ranking,
                          store: StoreDefinition, remaining: exp.Select) -> RulePlan:
    """The rows around a player of a global leaderboard, ranked in one read of every partition
    on the node asked: the player's score and the rows near it are of one state."""
    rows = [SubQuery(RanksAroundQuery(player, above, below, ranked.order.descending, ranked.order.tie_key), None)]
    schema = ranked_schema(store, RANK_COLUMN, ANCHOR_COLUMN)

    def combine(fetch: Fetch) -> pa.Table | Rows:
        return _together_rows(fetch(rows), schema)

    def rebind(parameters: list[exp.Expression]) -> RulePlan | None:
        other = _rebound(named, parameters)
        try:
            return _around_together_plan(store.key.coerce(literal(other)), other, above, below, ranked, store,
                                         remaining)
        except (ValueError, TypeError):
            return None

    return RulePlan(rows, "read the player's score and rank the rows near it in the score index of every "
                          "partition as one, in one read on the node asked (a global store)",
                    combine=combine, remaining=remaining, rebind=rebind)


def _around_remaining(select: exp.Select, ranked: Ranking, in_range: bool) -> exp.Select:
    """``select`` over the rule's rows: the range read from their rank and the player's
    (``ANCHOR_COLUMN``) as a WHERE, without the CTE that ranked the player. ``in_range``: the
    rows hold only those in the range already (a global store's one read keeps no other), so
    no WHERE, and what is left is a cut the receiver makes without DuckDB."""
    remaining = _with_rank_column(select, ranked, drop_qualify=False)
    condition = remaining.args["qualify"]
    for subquery in list(condition.find_all(exp.Subquery)):
        subquery.replace(exp.column(ANCHOR_COLUMN))  # the player's rank as this read ranked it
    for column in [c for c in condition.find_all(exp.Column) if ranked.is_rank(c)]:
        column.replace(exp.column(RANK_COLUMN))
    if not in_range:
        remaining.set("where", exp.Where(this=remaining.args["qualify"].this))
    remaining.set("qualify", None)
    eliminate_ctes(remaining)  # in place: the CTE that ranked the player, whose rank the rule's column holds
    return remaining


def _anchored(node: exp.Expression, select: exp.Select, ranked: Ranking,
              store: StoreDefinition) -> tuple[exp.Expression, int] | None:
    """(the player's literal, offset) for ``(SELECT rank FROM me) [+|- literal]`` with ``me`` a CTE that ranks
    that one player the way ``ranked`` does."""
    offset = 0
    if isinstance(node, (exp.Add, exp.Sub)) and isinstance(node.this, exp.Subquery):
        try:
            offset = int(literal(node.expression)) * (1 if isinstance(node, exp.Add) else -1)
        except (ValueError, TypeError):
            return None
        node = node.this
    if isinstance(node, exp.Paren):
        node = node.this
    inner = node.this if isinstance(node, exp.Subquery) else None
    if not isinstance(inner, exp.Select) or len(inner.expressions) != 1 or inner.args.get("where") \
            or inner.args.get("joins") or not isinstance(inner.expressions[0], exp.Column):
        return None
    source = _from(inner)
    cte = _cte(select, source.this.name) if source is not None and isinstance(source.this, exp.Table) else None
    if cte is None:
        return None
    table = _from(cte)
    theirs = ranking(cte, store)
    if table is None or not isinstance(table.this, exp.Table) or table.this.name.lower() != store.name.lower() \
            or theirs is None or theirs.function != ranked.function or theirs.order != ranked.order \
            or theirs.alias is None or theirs.alias.lower() != inner.expressions[0].name.lower():
        return None
    named = _players(cte.args["qualify"].this, store) if cte.args.get("qualify") else None
    return (named[0], offset) if named is not None and len(named) == 1 else None


def _from(select: exp.Select) -> exp.From | None:
    return select.args.get("from_") or select.args.get("from")  # the key sqlglot versions give it


def _cte(select: exp.Select, name: str) -> exp.Select | None:
    node: exp.Expression | None = select
    while node is not None:
        with_ = node.args.get("with") or node.args.get("with_")
        for cte in (with_.expressions if with_ is not None else []):
            if cte.alias.lower() == name.lower() and isinstance(cte.this, exp.Select):
                return cte.this
        node = node.parent
    return None


def _around(answers: list[tuple[pa.Table, pa.Table]], player: Any, score: int, ranked: Ranking,
            store: StoreDefinition) -> pa.Table:
    """The rows of every partition's window that can be in the range, each ranked exactly: a
    row's rank counts, in each partition, the rows before its window and those of its window
    that rank before the row. A row beyond some partition's window (on a side where that
    partition has rows it did not send) ranks further from the player than the range reaches."""
    order, ordered = ranked.order, key_order(store.key_format)
    windows = []
    for rows, said in answers:
        entries = SortedList(rows.column(ENTRY).to_pylist())
        ends = [score_of(entries[0]), score_of(entries[-1])] if entries else []
        best, worst = (max, min) if order.descending else (min, max)
        ahead_edge, behind_edge = best([*ends, score]), worst([*ends, score])
        windows.append((entries, said.column(BEFORE)[0].as_py(), said.column(AFTER)[0].as_py(), ahead_edge, behind_edge))

    def rank(s: int, key: bytes) -> int | None:
        n = 0
        for entries, ahead, behind, ahead_edge, behind_edge in windows:
            if ahead and _beats(s, ahead_edge, order) or behind and _beats(behind_edge, s, order):
                return None
            n += ahead + before(entries, s, key, order)
        return n + 1

    anchor = rank(score, ordered(store.key.serialize(player)))
    rows = pa.concat_tables([r.drop_columns([ENTRY]) for r, _ in answers]) if answers else _table([], store)
    entries = [e for r, _ in answers for e in r.column(ENTRY).to_pylist()]
    ranks = [rank(score_of(e), e[8:]) for e in entries]
    keep = [i for i, r in enumerate(ranks) if r is not None]
    return _ranked_rows(rows.take(keep), [ranks[i] for i in keep], anchor or 0)


def _beats(a: int, b: int, order: Order) -> bool:
    """Whether score ``a`` ranks strictly before score ``b``."""
    return a > b if order.descending else a < b


def _ranked_rows(rows: pa.Table, ranks: list, anchor: int) -> pa.Table:
    return rows.append_column(RANK_COLUMN, pa.array(ranks, pa.int64())).append_column(
        ANCHOR_COLUMN, pa.array([anchor] * len(ranks), pa.int64()))


# ---- shared ----------------------------------------------------------------------------------

def _players(node: exp.Expression | None, store: StoreDefinition) -> list[exp.Expression] | None:
    """The values a QUALIFY clause names for the key (key = v, or key IN (...)); None for any
    other filter."""
    if isinstance(node, exp.Paren):
        return _players(node.this, store)
    if isinstance(node, exp.EQ):
        for a, b in ((node.this, node.expression), (node.expression, node.this)):
            if is_plain_column(a, store.key_name):
                return [b]
    if isinstance(node, exp.In) and is_plain_column(node.this, store.key_name) and not node.args.get("query"):
        return list(node.expressions)
    return None


def _rebound(node: exp.Expression, parameters: list[exp.Expression]) -> exp.Expression:
    """``node``, or the parameter it was bound from, as the statement's other values bind it."""
    index = parameter_of(node)
    return node if index is None else parameters[index]


def _split(batches: list[pa.RecordBatch], store: StoreDefinition, *keep: str) -> tuple[pa.Table, pa.Table]:
    """(the rows, in the store's columns and ``keep``; what the partitions said beside them:
    the rows whose key is null). Each partition's batch holds its rows first, then what it
    said (store._with_tail), so the two are slices, not filters: this runs on every rank."""
    if not batches:
        return _table([], store), pa.table({})
    rows, said = [], []
    for b in batches:
        held = b.num_rows - b.column(store.key_name).null_count
        rows.append(b.slice(0, held))
        said.append(b.slice(held))
    schema = pa.schema([*store.arrow_schema(), *(batches[0].schema.field(k) for k in keep)])
    table = pa.Table.from_batches(rows, batches[0].schema).select(schema.names)
    return table.cast(schema), pa.Table.from_batches(said, batches[0].schema)


def _table(batches: list[pa.RecordBatch], store: StoreDefinition) -> pa.Table:
    """The batches' rows in the store's schema."""
    return _in_schema(batches, store.arrow_schema())


def _together_rows(answers: list[pa.RecordBatch | Rows], schema: pa.Schema) -> pa.Table | Rows:
    """A global store's answer read in one go on the node asked, in ``schema``: as the Python
    values its store type gave (Rows) where their types are those already, else in Arrow."""
    rows = concat_rows([a for a in answers if a.num_rows], schema) \
        if all(isinstance(a, Rows) for a in answers) else None
    return rows if rows is not None else _in_schema([as_batch(a) for a in answers], schema)


def _in_schema(batches: list[pa.RecordBatch], schema: pa.Schema) -> pa.Table:
    """The batches' rows as one table in ``schema``. The partitions that answered none are left
    out, and a cast to the types the rows have already is skipped: on a one-row answer each
    costs more than the read."""
    rows = [b for b in batches if b.num_rows]
    if not rows:
        return schema.empty_table()
    table = pa.Table.from_batches(rows).combine_chunks()
    return table if table.schema.equals(schema) else table.cast(schema)
