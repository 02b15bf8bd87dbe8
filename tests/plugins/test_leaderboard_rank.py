"""The leaderboard's rank rules over real RocksDB shards: statements planned by the real planner,
the rules' queries answered by the shards' indexes through a stand-in for the receiver's fetch,
and the receiver's statement run in DuckDB; every answer equal to DuckDB's over the same rows,
for RANK, DENSE_RANK and ROW_NUMBER in both directions, and still when writes land between a
rank's two rounds, or during a global leaderboard's one read."""

from __future__ import annotations

import random
from typing import Callable

import duckdb
import pyarrow as pa
import pytest

from federator.catalog import StoreDefinition
from federator.partitioner import partition_for
from federator.query.rows import Rows, as_batch
from federator.sql.parse import parse
from federator.sql.planner import bind_parameters, literal, plan_query
from federator.store import ChangelogRecord, Shard
from federator.store.layer import UNBOUNDED
from federator.store.shard import TogetherReads
from federator.store.together import answer_together
from federator_plugins.leaderboard import rules
from federator_plugins.leaderboard.rules import RankRule, TopKRule
from tests.registry import REGISTRY

P = 3


class Fetch:
    """The engine's fetch over shards in this process; ``asked`` names the query types each call
    asked (each once a call), ``between`` runs before every call after the first (a write landing
    between rounds), and ``during`` once, inside the first read of every partition at once, after
    it has read them (a write landing during the read; ``raced`` then says it ran)."""

    refreshed_rows = 0

    def __init__(self, shards: list[Shard], between: Callable[[], None] | None = None,
                 during: Callable[[], None] | None = None, keeps: bool = False) -> None:
        self.shards, self.asked, self.between, self.during, self.raced = shards, [], between, during, False
        self.keeps = keeps  # whether it says it keeps partitions' answers (``keep=True``): the engine's for a partitioned store

    def racing(self, handler):
        """``handler``, with ``during`` run once after it read."""
        def read(views, query):
            answer = handler(views, query)
            if self.during is not None and not self.raced:
                self.raced = True
                self.during()
            return answer
        return read

    def __call__(self, subqueries, keep: bool = False) -> list[pa.RecordBatch]:
        if self.asked and self.between is not None:
            self.between()
        out = []
        self.asked.extend(dict.fromkeys(sq.query.type_name for sq in subqueries))
        for sq in subqueries:
            together = self.shards[0].store_type.together_handlers.get(type(sq.query))
            if together is not None and self.shards[0].definition.is_global:  # as the node asked answers it
                results = answer_together(self.shards, sq.query, UNBOUNDED, self.racing(together), TogetherReads())
                assert all(r.ok for r in results), results
                out.extend(r.batch for r in results if r.batch is not None)  # as the dispatcher takes them
                continue
            for p in sq.partitions if sq.partitions is not None else range(P):
                out.append(self.shards[p].query(sq.query)[0])
        return out


def _arrow(rows: pa.Table | Rows) -> pa.Table:
    """A rule's rows as the receiver hands them to DuckDB (a global store's come as Python values)."""
    return rows.to_table() if isinstance(rows, Rows) else rows


class Board:
    """A three-partition leaderboard and the same rows as a table for DuckDB."""

    def __init__(self, root, fmt: str, scope: str = "partitioned") -> None:
        self.defn = StoreDefinition.from_dict({
            "name": "lb", "type": "leaderboard", "topic": "app-lb-changelog", "partitions": P,
            "key": {"name": "player", "format": "string"}, "value": {"name": "score", "format": fmt},
            "global": scope == "global"}, REGISTRY)
        self.shards = [Shard(root / f"s{p}", self.defn, p) for p in range(P)]
        self.scores: dict[str, float] = {}
        self.offsets = [0] * P
        rnd = random.Random(5)
        self.write(*[(f"p{i:03d}", rnd.randrange(-20, 40)) for i in range(300)],  # many ties
                   ("p000", -0.0 if fmt == "double" else 0))

    def write(self, *changes: tuple[str, float | None]) -> None:
        """Each partition's changes in one batch, as a changelog's records are applied."""
        batches: dict[int, list[ChangelogRecord]] = {}
        for player, score in changes:
            p = partition_for(player.encode(), P)
            value = None if score is None else self.defn.value.serialize(score)
            batches.setdefault(p, []).append(ChangelogRecord(player.encode(), value, self.offsets[p], 1_700_000_000_000))
            self.offsets[p] += 1
            if score is None:
                self.scores.pop(player, None)
            else:
                self.scores[player] = float(score) if self.defn.value_format == "double" else score
        for p, records in batches.items():
            self.shards[p].apply(records)

    def duckdb(self, text: str, params: list, scores: dict[str, float] | None = None) -> list[tuple]:
        """DuckDB's answer over the board's rows (or over ``scores``)."""
        scores = self.scores if scores is None else scores
        db = duckdb.connect()
        kind = pa.float64() if self.defn.value_format == "double" else pa.int64()
        db.register("lb", pa.table({"player": list(scores), "score": pa.array(list(scores.values()), kind)}))
        return db.execute(text, params).fetchall()

    def answer(self, text: str, params: list, fetch: Fetch, planned_with: list | None = None) -> list[tuple]:
        """The statement as a receiver answers it: planned, each store reference's rows from the
        rule (its combine, or its queries' rows), the receiver's SQL in DuckDB. ``planned_with``:
        planned for those parameters, then rebound to ``params`` (a plan kept for the text)."""
        stmt = parse(text)
        db = duckdb.connect()

        def schema_of(sql: str, relations: dict[str, pa.Table]) -> pa.Schema:
            for name, table in relations.items():
                db.register(name, table)
            return db.sql(sql).to_arrow_table().schema

        plan = plan_query(bind_parameters(stmt.select, planned_with or params, stmt.param_count), lambda _: self.defn,
                          lambda _: None, [TopKRule(), RankRule()], schema_of)
        if planned_with is not None:
            assert plan.rebind is not None, plan
            plan = plan.rebind(params)
        for ref in plan.refs:
            if ref.combine is not None:
                rows = _arrow(ref.combine(fetch))
            else:
                assert ref.work.sql is None, ref.work
                rows = pa.Table.from_batches(map(as_batch, fetch(ref.subqueries)), self.defn.arrow_schema())
            db.register(ref.relation, rows)
        return db.execute(plan.sql).fetchall()

    def close(self) -> None:
        for s in self.shards:
            s.close()


@pytest.fixture(scope="module", params=["long", "double"])
def board(tmp_path_factory, request):
    """Read, never written: shared by the module's tests (``written`` for those that write)."""
    b = Board(tmp_path_factory.mktemp("board"), request.param)
    yield b
    b.close()


@pytest.fixture(scope="module")
def global_board(tmp_path_factory):
    """The same board kept as a global store: the node asked ranks from every partition at once."""
    b = Board(tmp_path_factory.mktemp("global-board"), "long", "global")
    yield b
    b.close()


@pytest.fixture
def written(tmp_path):
    b = Board(tmp_path, "long")
    yield b
    b.close()


@pytest.fixture
def written_global(tmp_path):
    b = Board(tmp_path, "long", "global")
    yield b
    b.close()


PLAYERS = ["p000", "p017", "p150", "nobody", "p299"]
NEIGHBOURS = [p for p in (f"p{i:03d}" for i in range(300)) if partition_for(p.encode(), P) == partition_for(b"p017", P)][:3]
WITH_PLAYERS = "QUALIFY player IN (?, ?, ?, ?, ?) ORDER BY player"
AROUND = ("WITH me AS (SELECT {f} OVER (ORDER BY score {d}{t}) AS r FROM lb QUALIFY player = ?) "
          "SELECT player, score, {f} OVER (ORDER BY score {d}{t}) AS r FROM lb "
          "QUALIFY r BETWEEN (SELECT r FROM me) - {a} AND (SELECT r FROM me) + {b} ORDER BY r, player")
STATEMENTS = [  # (text, parameters, the rule's queries, and on a global leaderboard)
    ("SELECT player, score, RANK() OVER (ORDER BY score {d}) AS r FROM lb " + WITH_PLAYERS, PLAYERS, "Keys Rank",
     "PlayerRanks"),
    # players one partition holds: it says what ranks before them there, the others count after
    ("SELECT RANK() OVER (ORDER BY score {d}) AS r, player FROM lb QUALIFY player = ?", ["p017"], "Places Rank",
     "PlayerRanks"),
    ("SELECT player, score, DENSE_RANK() OVER (ORDER BY score {d}) AS r FROM lb QUALIFY player = ?", ["p150"],
     "Places Rank", "PlayerRanks"),
    ("SELECT player, ROW_NUMBER() OVER (ORDER BY score {d}, player DESC) AS n FROM lb QUALIFY player = ?", ["p000"],
     "Places Rank", "PlayerRanks"),
    ("SELECT player, score, RANK() OVER (ORDER BY score {d}) AS r FROM lb QUALIFY player IN (?, ?, ?) ORDER BY player",
     NEIGHBOURS, "Places Rank", "PlayerRanks"),
    ("SELECT player, DENSE_RANK() OVER (ORDER BY score {d}) AS r FROM lb " + WITH_PLAYERS, PLAYERS, "Keys Rank",
     "PlayerRanks"),
    ("SELECT player, ROW_NUMBER() OVER (ORDER BY score {d}, player) AS n FROM lb " + WITH_PLAYERS, PLAYERS,
     "Keys Rank", "PlayerRanks"),
    ("SELECT player, ROW_NUMBER() OVER (ORDER BY score {d}, player DESC) AS n FROM lb " + WITH_PLAYERS, PLAYERS,
     "Keys Rank", "PlayerRanks"),
    ("SELECT player, score, RANK() OVER (ORDER BY score {d}) AS r FROM lb QUALIFY r <= 10 ORDER BY r, player", [],
     "TopK", "TopK"),
    ("SELECT player, score, DENSE_RANK() OVER (ORDER BY score {d}) AS r FROM lb QUALIFY r <= 4 ORDER BY r, player",
     [], "TopK", "TopK"),
    ("SELECT player, RANK() OVER (ORDER BY score {d}) AS r FROM lb "
     "QUALIFY RANK() OVER (ORDER BY score {d}) BETWEEN 3 AND 12 AND player > 'p1' ORDER BY r, player", [], "TopK",
     "TopK"),
    ("SELECT player, ROW_NUMBER() OVER (ORDER BY score {d}, player) AS n FROM lb QUALIFY n < 8 ORDER BY n", [],
     "TopK", "TopK"),
    ("SELECT player, score FROM lb ORDER BY score {d}, player LIMIT 10", [], "TopK", "TopK"),
    ("SELECT player, score FROM lb ORDER BY score {d}, player LIMIT 5 OFFSET 7", [], "TopK", "TopK"),
    # the CTE's rank of the player is read from the rows around it, not asked on its own
    (AROUND.format(f="RANK()", d="{d}", t="", a=5, b=5), ["p150"], "Keys Around", "RanksAround"),
    (AROUND.format(f="RANK()", d="{d}", t="", a=2, b=7), ["p000"], "Keys Around", "RanksAround"),
    (AROUND.format(f="ROW_NUMBER()", d="{d}", t=", player", a=3, b=3), ["p017"], "Keys Around", "RanksAround"),
    (AROUND.format(f="ROW_NUMBER()", d="{d}", t=", player DESC", a=0, b=6), ["p150"], "Keys Around",
     "RanksAround"),
    (AROUND.format(f="RANK()", d="{d}", t=", player DESC", a=4, b=0), ["p299"], "Keys Around", "RanksAround"),
    (AROUND.format(f="RANK()", d="{d}", t="", a=-2, b=9), ["p017"], "Keys Around", "RanksAround"),  # after it alone
    (AROUND.format(f="RANK()", d="{d}", t="", a=5, b=5), ["nobody"], "Keys", "RanksAround"),
]
ROUNDS = [s for s in STATEMENTS if s[2] not in ("TopK", "Places Rank") and s[1] != ["nobody"]]  # a player's score, then what ranks it
HOME = [s for s in STATEMENTS if s[2] == "Places Rank"]


def check_statement(board: Board, text: str, params: list, asked: str) -> None:
    """The statement answered as DuckDB answers it, by asking the rule's queries ``asked``."""
    fetch = Fetch(board.shards)
    assert board.answer(text, params, fetch) == board.duckdb(text, params)
    assert " ".join(q.removesuffix("Query") for q in fetch.asked) == asked


@pytest.mark.parametrize("direction", ["DESC", "ASC"])
@pytest.mark.parametrize("text, params, asked, _", STATEMENTS)
def test_ranks_equal_duckdb(board, direction, text, params, asked, _) -> None:
    check_statement(board, text.format(d=direction), params, asked)


@pytest.mark.parametrize("direction", ["DESC", "ASC"])
@pytest.mark.parametrize("text, params, _, in_one_read", STATEMENTS)
def test_a_global_leaderboard_ranks_in_one_read_as_duckdb_does(global_board, direction, text, params, _,
                                                                in_one_read) -> None:
    # the players' scores and what ranks them in one read of every partition on the node asked
    check_statement(global_board, text.format(d=direction), params, in_one_read)


@pytest.mark.parametrize("f, t", [("RANK()", ""), ("ROW_NUMBER()", ", player"), ("ROW_NUMBER()", ", player DESC")])
def test_the_players_around_the_best_and_the_worst(board, global_board, f, t) -> None:
    """The range cut at the ends: the best player has no one before it, the worst no one after
    (on a global leaderboard too, in its one read)."""
    for b in (board, global_board):
        best = max(b.scores, key=lambda p: (b.scores[p], p))
        worst = min(b.scores, key=lambda p: (b.scores[p], p))
        for player in (best, worst):
            for d in ("DESC", "ASC"):
                text = AROUND.format(f=f, d=d, t=t, a=5, b=5)
                fetch = Fetch(b.shards)
                assert b.answer(text, [player], fetch) == b.duckdb(text, [player])
                assert len(fetch.asked) == (1 if b.defn.is_global else 2)


@pytest.mark.parametrize("text, params, asked, _", ROUNDS)
def test_a_write_between_the_rounds_is_read_again(written, text, params, asked, _) -> None:
    """Writes move the asked players (and others) between a rank's two rounds: the answer is
    the one over the rows after them, never a mix of both."""
    text = text.format(d="DESC")
    rnd = random.Random(3)
    moves = iter(range(3))  # the first three calls after the first each follow a write

    def write() -> None:
        if next(moves, None) is not None:
            written.write((rnd.choice(params), rnd.randrange(-30, 60)), (f"p{rnd.randrange(300):03d}", rnd.randrange(-30, 60)))

    fetch = Fetch(written.shards, write)
    got = written.answer(text, params, fetch)
    assert got == written.duckdb(text, params)
    assert fetch.asked.count("RankQuery") + fetch.asked.count("AroundQuery") > 1  # asked again


@pytest.mark.parametrize("direction", ["DESC", "ASC"])
@pytest.mark.parametrize("text, params, _, __", HOME)
def test_the_other_partitions_scores_kept_are_counted_where_the_player_is_asked(board, direction, text, params, _,
                                                                                __) -> None:
    """With answers kept (a partitioned store's), the players' partition says what ranks before
    them there and the others' whole scores are counted by the node asked: no second round but
    where ties are broken by the key."""
    text = text.format(d=direction)
    fetch = Fetch(board.shards, keeps=True)
    assert board.answer(text, params, fetch) == board.duckdb(text, params)
    assert " ".join(q.removesuffix("Query") for q in fetch.asked) == ("Places Rank" if "player DESC" in text
                                                                       else "Places Scores")


def test_a_partition_too_large_to_send_counts_for_itself(written, monkeypatch) -> None:
    """Past LISTED_SCORES rows a partition sends no scores (one null): the players' ranks are
    then counted by every other partition, as without kept answers."""
    home = partition_for(b"p017", P)
    monkeypatch.setattr(rules, "LISTED_SCORES", sum(partition_for(p.encode(), P) == home for p in written.scores))
    other = (home + 1) % P
    written.write(*[(f"x{i}", 100) for i in range(400) if partition_for(f"x{i}".encode(), P) == other])
    for dense in ("RANK()", "DENSE_RANK()"):
        text = f"SELECT player, score, {dense} OVER (ORDER BY score DESC) AS r FROM lb QUALIFY player = ?"
        fetch = Fetch(written.shards, keeps=True)
        assert written.answer(text, ["p017"], fetch) == written.duckdb(text, ["p017"])
        assert fetch.asked == ["PlacesQuery", "ScoresQuery", "RankQuery"]


@pytest.mark.parametrize("keeps", [False, True])
def test_each_partition_counts_as_the_round_that_read_it(written, keeps) -> None:
    """A write to the player's partition after its one read is not in the answer, not even
    half (its row and what ranks before it are of one read), and a write to another partition
    before that partition is read is: each partition as of the read that asked it, as its
    position in the answer's token says."""
    text = "SELECT player, score, RANK() OVER (ORDER BY score DESC) AS r FROM lb QUALIFY player = ?"
    home = partition_for(b"p017", P)
    neighbour = next(p for p in written.scores if p != "p017" and partition_for(p.encode(), P) == home)
    elsewhere = next(p for p, score in written.scores.items()  # ranked after the player, then before it
                     if partition_for(p.encode(), P) != home and score < written.scores["p017"])
    was = dict(written.scores)

    def write() -> None:
        written.write(("p017", 70), (neighbour, 80), (elsewhere, written.scores["p017"] + 1))

    fetch = Fetch(written.shards, write, keeps=keeps)
    got = written.answer(text, ["p017"], fetch)
    as_read = {p: (was if partition_for(p.encode(), P) == home else written.scores)[p] for p in was}
    assert got == written.duckdb(text, ["p017"], as_read) != written.duckdb(text, ["p017"], was)


@pytest.mark.parametrize("text, params, _, in_one_read", ROUNDS)
def test_a_write_landing_during_a_global_leaderboards_one_read_is_read_again(written_global, text, params, _,
                                                                             in_one_read) -> None:
    """A write moves the asked player (to the top) and another while the node asked reads every
    partition: the shards throw that read away and read again, so the answer is the one over
    the rows after the write, from the one query."""
    text = text.format(d="DESC")
    untouched = written_global.duckdb(text, params)

    def write() -> None:
        written_global.write((params[0], 100), ("p001", -50))

    fetch = Fetch(written_global.shards, during=write)
    assert written_global.answer(text, params, fetch) == written_global.duckdb(text, params) != untouched
    assert fetch.raced and " ".join(q.removesuffix("Query") for q in fetch.asked) == in_one_read


def test_shapes_the_rule_leaves_to_the_general_path(board) -> None:
    """ROW_NUMBER over tied scores (DuckDB numbers ties in no set order), a rank in a larger
    expression, a WHERE before the window: all rows read, DuckDB ranks them."""
    for text in ("SELECT player, ROW_NUMBER() OVER (ORDER BY score DESC) AS n FROM lb QUALIFY player = 'p001'",
                 "SELECT player, RANK() OVER (ORDER BY score DESC) + 1 AS r FROM lb QUALIFY player = 'p001'",
                 "SELECT player, RANK() OVER (ORDER BY score DESC) AS r FROM lb WHERE score > 0 QUALIFY player = 'p001'",
                 "SELECT player, RANK() OVER (ORDER BY score DESC) AS r FROM lb QUALIFY r >= 290"):
        stmt = parse(text)
        assert RankRule().plan(bind_parameters(stmt.select, [], 0), board.defn) is None, text


def test_a_plan_rebound_to_another_player_ranks_that_player(board) -> None:
    stmt = parse("SELECT player, RANK() OVER (ORDER BY score DESC) AS r FROM lb QUALIFY player IN (?, 'p007', ?)")
    plan = RankRule().plan(bind_parameters(stmt.select, ["p001", "p002"], 2), board.defn)
    rebound = plan.rebind([literal("p100", 0), literal("p200", 1)])
    assert rebound.subqueries[0].query.keys == ("p100", "p007", "p200")
    ranks = dict(zip(*_arrow(rebound.combine(Fetch(board.shards))).select(["player", "__rank"]).to_pydict().values()))
    want = board.duckdb("SELECT player, RANK() OVER (ORDER BY score DESC) FROM lb "
                        "QUALIFY player IN ('p100', 'p007', 'p200')", [])
    assert ranks == dict(want)


def test_a_global_leaderboards_plan_around_a_player_rebound_to_another_ranks_around_that_one(global_board) -> None:
    for f, t in (("RANK()", ""), ("ROW_NUMBER()", ", player DESC")):
        text = AROUND.format(f=f, d="DESC", t=t, a=3, b=4)
        for player in ("p017", "nobody"):
            fetch = Fetch(global_board.shards)
            got = global_board.answer(text, [player], fetch, planned_with=["p150"])
            assert got == global_board.duckdb(text, [player])
            assert fetch.asked == ["RanksAroundQuery"]


def test_the_players_around_one_among_many_tied_on_a_global_leaderboard(written_global) -> None:
    """A hundred players share a score: RANK keeps them all (one rank), ROW_NUMBER numbers them
    by the key, the range cut inside the tied rows."""
    written_global.write(*[(f"t{i:03d}", 7) for i in range(100)])
    for f, t in (("RANK()", ""), ("ROW_NUMBER()", ", player"), ("ROW_NUMBER()", ", player DESC")):
        for d in ("DESC", "ASC"):
            for player in ("t000", "t050", "t099"):
                check_statement(written_global, AROUND.format(f=f, d=d, t=t, a=4, b=3), [player], "RanksAround")
