"""A Kafka Streams application's stores, served by SQL from its changelogs.

The game (as the Spark seeds play it: players, 20 games, scores 0-999, a round about every 20
minutes) runs as a real Kafka Streams application (tests/integration/kstreams/, RocksDB stores,
changelogs on) on Apache Kafka: per-player totals (a timestamped key-value store), scores per
minute (tumbling windows), play sessions (session windows) and player levels (a versioned
table fed out-of-order updates and deletes). Its own interactive queries (IQv2 over HTTP) are
the oracle. Federator's stores are declared over the application's changelog topics with the
how-to's commands (docs/how-to/kafka-streams.md), and once the application has processed all
its input and Federator reads at the changelogs' end offsets, every SQL answer equals the
application's; then again after more input.
"""

from __future__ import annotations

import random
import shlex
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

from federator import kafka
from federator.query.position import Position
from federator_spark.jobs.game_events import EVENTS_PER_PLAYER, GAMES, MEAN_GAP_MS, players_for
from tests.conftest import federator_cmd, free_port
from tests.docs_blocks import ROOT, blocks
from tests.integration.changelog_util import produce, read_partition
from tests.integration.cluster import NodeProcess, wait_for
from tests.integration.kstreams_app import StreamsApp

HOWTO = ROOT / "docs" / "how-to" / "kafka-streams.md"
PARTITIONS = 4  # of the input topics, so of every changelog (the how-to's --partitions)
LONG = ">q"
STORES = ("player_totals", "scores_per_minute", "player_sessions", "player_levels")
# the names the how-to's commands use, and what the test puts in their place
HOWTO_BOOTSTRAP, HOWTO_STREAMS_APP, HOWTO_FEDERATOR_APP = "localhost:9092", "game-stats", "game-sql"


class Game:
    """The application, its input topics, a Federator node over its changelogs, and the players so far."""

    def __init__(self, bootstrap: str, root: Path) -> None:
        suffix = f"{time.time_ns() % 10**9}"
        self.bootstrap = bootstrap
        self.streams_id, self.federator_id = f"game-stats-{suffix}", f"game-sql-{suffix}"
        self.results, self.levels = f"{self.streams_id}-rounds", f"{self.streams_id}-levels"
        adm = kafka.admin(bootstrap)
        for topic in (self.results, self.levels):
            kafka.ensure_topic(adm, topic, PARTITIONS)
        self.app = StreamsApp(bootstrap, self.streams_id, root / "streams", free_port(), self.results, self.levels)
        self.node = NodeProcess(bootstrap, self.federator_id, "n0", root / "federator" / "n0", standby_replicas=0)
        self.players: set[str] = set()
        # now, hour-aligned, less three days: inside every retention, whatever the broker's clock
        self.base_ms = (int(time.time() * 1000) // 3_600_000 - 72) * 3_600_000

    def produce_rounds(self, events: int, seed: int) -> None:
        """``events`` rounds as the seeds make them, each under its player's key, timed by its record timestamp."""
        rnd, players = random.Random(seed), players_for(events)
        rows = []
        for _ in range(events):
            player = f"player_{rnd.randrange(players):05d}"
            ts = self.base_ms + rnd.randrange(EVENTS_PER_PLAYER * MEAN_GAP_MS)
            value = f"game_{rnd.randrange(GAMES):02d},{rnd.randrange(1000)},{ts}"
            rows.append((player.encode(), player.encode(), value.encode(), ts))
            self.players.add(player)
        produce(self, self.results, PARTITIONS, rows)

    def produce_levels(self, updates: list[tuple[str, int | None, int]]) -> None:
        """(player, level or None to delete, minutes after the base), in the order given."""
        import struct

        produce(self, self.levels, PARTITIONS, [
            (p.encode(), p.encode(), None if level is None else struct.pack(LONG, level), self.base_ms + m * 60_000)
            for p, level, m in updates])
        self.players.update(p for p, _, _ in updates)

    @property
    def bootstrap_servers(self) -> str:  # what changelog_util's helpers take
        return self.bootstrap

    def wait_idle(self) -> Position:
        """Wait until the application has committed all its input (its stores and changelogs are
        final); the Position of the changelogs' end offsets: the token to read them all."""
        adm = kafka.admin(self.bootstrap)
        inputs = [TopicPartition(t, p) for t in (self.results, self.levels) for p in range(PARTITIONS)]

        def idle() -> bool:
            committed = adm.list_consumer_group_offsets([ConsumerGroupTopicPartitions(self.streams_id, inputs)])
            got = {(tp.topic, tp.partition): tp.offset for tp in committed[self.streams_id].result(10).topic_partitions}
            # a partition without input has no committed offset (negative)
            return all(max(got[(tp.topic, tp.partition)], 0) == high for tp, high in zip(inputs, self._ends(inputs)))

        wait_for(lambda: self.app.state() == "RUNNING" and idle(), 120, "the Kafka Streams application to be idle")
        changelogs = [TopicPartition(self.app.changelog(s), p) for s in STORES for p in range(PARTITIONS)]
        ends: dict[str, dict[int, int]] = {}
        for tp, high in zip(changelogs, self._ends(changelogs)):
            if high > 0:
                ends.setdefault(tp.topic, {})[tp.partition] = high - 1
        assert len(ends) == len(STORES), ends
        return Position(ends)

    def _ends(self, tps: list[TopicPartition]) -> list[int]:
        c = kafka.reader(self.bootstrap)
        try:
            return [c.get_watermark_offsets(tp, timeout=10)[1] for tp in tps]
        finally:
            c.close()

    def sql(self, statement: str, token: Position) -> list[list]:
        status, body = self.node.sql(statement, consistency_token=token.to_token(), timeout_ms=60_000)
        assert status == 200, body
        return body["rows"]


def howto_commands(game: Game) -> list[list[str]]:
    """The how-to's `federator store create` commands, with the test's cluster and application ids."""
    (block,) = [b for b in blocks(HOWTO) if b.lang == "sh" and "federator store create" in b.code]
    text = (block.code.replace("\\\n", " ").replace(HOWTO_BOOTSTRAP, game.bootstrap)
            .replace(f"{HOWTO_STREAMS_APP}-", f"{game.streams_id}-")
            .replace(f"--application-id {HOWTO_FEDERATOR_APP}", f"--application-id {game.federator_id}"))
    return [shlex.split(line)[1:] for line in text.splitlines() if line.strip().startswith("federator store create")]


@pytest.fixture(scope="module")
def game(apache_kafka, tmp_path_factory) -> Iterator[Game]:
    g = Game(apache_kafka.bootstrap_servers, tmp_path_factory.mktemp("kstreams"))
    try:
        g.node.start(wait=False)  # it follows the catalog: stores declared later are picked up
        wait_for(lambda: g.app.state() == "RUNNING", 120, "the Kafka Streams application to run")
        # the changelogs exist once the application runs; the commands run side by side
        creates = [subprocess.Popen(federator_cmd(*args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                   for args in howto_commands(g)]
        for proc in creates:
            out, _ = proc.communicate(timeout=60)
            assert proc.returncode == 0, out
        wait_for(g.node.ready, 60, "the Federator node to be ready")
        yield g
    finally:
        g.node.stop()
        g.app.stop()


# ---- the oracle and the SQL, side by side ---------------------------------------------------------


def oracle_answers(game: Game, player: str | None = None) -> dict[str, list[tuple]]:
    """The application's answers: every row (range queries; a session fetch and a versioned key
    query for each player, the only ones those stores take), or ``player``'s (key queries)."""
    app = game.app
    one = {} if player is None else {"key": player}
    players = sorted(game.players) if player is None else [player]
    totals = app.query("kv", store="player_totals", **one)["rows"]
    windows = app.query("window", store="scores_per_minute", **{"from": 0, "to": 2**62}, **one)["rows"]
    sessions = app.query("session", store="player_sessions", key=players)["rows"]
    levels = app.query("versioned", store="player_levels", key=players)["rows"]
    return {
        "player_totals": sorted((r["key"], r["value"]["rounds"], r["value"]["total_score"], r["value"]["best_score"],
                                 r["value"]["last_seen"], r["timestamp"]) for r in totals),
        "scores_per_minute": sorted((r["key"], r["start"], r["end"], r["value"]) for r in windows),
        "player_sessions": sorted((r["key"], r["start"], r["end"], r["value"]) for r in sessions),
        "player_levels": sorted((r["key"], r["value"], r["timestamp"]) for r in levels if r["value"] is not None),
    }


SQL = {
    "player_totals": "SELECT player, rounds, total_score, best_score, epoch_ms(last_seen), epoch_ms(rowtime) "
                     "FROM player_totals",
    "scores_per_minute": "SELECT player, epoch_ms(window_start), epoch_ms(window_end), total_score "
                         "FROM scores_per_minute",
    "player_sessions": "SELECT player, epoch_ms(window_start), epoch_ms(window_end), rounds FROM player_sessions",
    "player_levels": "SELECT player, level, epoch_ms(rowtime) FROM player_levels",
}


def sql_answers(game: Game, token: Position) -> dict[str, list[tuple]]:
    return {store: sorted(tuple(r) for r in game.sql(statement, token)) for store, statement in SQL.items()}


def assert_sql_equals_the_application(game: Game) -> None:
    token = game.wait_idle()
    expected = oracle_answers(game)
    assert all(expected.values()), {s: len(rows) for s, rows in expected.items()}
    got = sql_answers(game, token)
    for store in STORES:
        assert got[store] == expected[store], store
    # a point read takes each store type's key query on both sides
    for player in ("player_00001", "player_00003", sorted(game.players)[-1]):
        expected = oracle_answers(game, player)
        for store, statement in SQL.items():
            rows = game.sql(f"{statement} WHERE player = '{player}'", token)
            assert sorted(tuple(r) for r in rows) == expected[store], (store, player)


# the level updates of round one: (player, level or None to delete, minutes after the base),
# in the order they reach the topic; some arrive after newer ones (a late update is history)
LEVELS_1 = [
    ("player_00001", 3, 100), ("player_00001", 1, 10),  # late: 3 stays
    ("player_00002", 2, 50), ("player_00002", 5, 60), ("player_00002", 4, 55),  # late: 5 stays
    ("player_00003", 7, 20), ("player_00003", None, 30),  # deleted
    ("player_00004", 9, 40), ("player_00004", None, 35),  # a late delete: 9 stays
    ("player_00005", 6, 70), ("player_00005", 8, 70),  # the same time: the later one replaces it
]
LEVELS_2 = [
    ("player_00003", 2, 25),  # older than its delete: still deleted
    ("player_00001", 4, 200), ("player_00001", 2, 150),  # a newer level, then a late one
    ("player_00003", 1, 31),  # newer than its delete: back
    ("player_00006", 5, 10),
]


def test_sql_answers_equal_the_applications_own_for_every_store_type(game: Game) -> None:
    game.produce_rounds(3_000, seed=1)
    game.produce_levels(LEVELS_1)
    assert_sql_equals_the_application(game)
    levels = {r[0]: r[1] for r in oracle_answers(game)["player_levels"]}
    assert levels["player_00001"] == 3 and "player_00003" not in levels and levels["player_00004"] == 9
    # the changelog's last record of a key is not its latest value: a kv store over it would be wrong
    changelog = game.app.changelog("player_levels")
    last = {k.decode(): v for p in range(PARTITIONS) for _, k, v, _ in read_partition(game, changelog, p)}
    assert last["player_00001"] == (1).to_bytes(8, "big") and last["player_00004"] is None

    game.produce_rounds(1_500, seed=2)
    game.produce_levels(LEVELS_2)
    assert_sql_equals_the_application(game)
    levels = {r[0]: r[1] for r in oracle_answers(game)["player_levels"]}
    assert levels["player_00001"] == 4 and levels["player_00003"] == 1


def test_the_howtos_queries_answer_as_the_application_does(game: Game) -> None:
    """The how-to's SQL examples, run as written, against answers made from the application's."""
    if not game.players:  # run alone
        game.produce_rounds(3_000, seed=1)
        game.produce_levels(LEVELS_1)
    token = game.wait_idle()
    (block,) = [b for b in blocks(HOWTO) if b.lang == "sql"]
    top, one, long_sessions, joined = [game.sql(q, token) for q in block.code.split(";") if q.strip()]
    expected = oracle_answers(game)
    totals = {r[0]: r for r in expected["player_totals"]}
    assert [r[1] for r in top] == sorted((r[2] for r in totals.values()), reverse=True)[:10]
    assert len(one) == len([r for r in expected["scores_per_minute"] if r[0] == "player_00007"]) > 0
    assert sorted((r[0], r[3]) for r in long_sessions) == sorted(
        (r[0], r[3]) for r in expected["player_sessions"] if r[2] - r[1] > 3_600_000)
    assert sorted(map(tuple, joined)) == sorted(
        (p, totals[p][2], level) for p, level, _ in expected["player_levels"] if p in totals)
