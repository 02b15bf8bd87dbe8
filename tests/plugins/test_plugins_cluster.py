"""Plugins over a real three-node cluster: the leaderboard's top-k and rank, the prefix scan,
and a third-party plugin installed from its own directory, all compared with DuckDB."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
import urllib3

from federator import kafka
from federator.partitioner import partition_for
from federator.query.position import Position
from tests.integration.changelog_util import produce, read_partition, register
from tests.integration.cluster import Cluster, NodeProcess, scrape, total, wait_for

HTTP = urllib3.PoolManager()
EXAMPLE_PLUGIN = Path(__file__).resolve().parents[2] / "docs" / "example-plugin"
P = 4
TS = 1_700_000_000_000


def sql(node, text: str, params: list | None = None, status: int = 200, **options) -> dict:
    resp = HTTP.request("POST", f"http://{node.endpoint}/v1/sql",
                        body=json.dumps({"sql": text, "parameters": params or [], **options}),
                        headers={"Content-Type": "application/json"})
    body = json.loads(resp.data)
    assert resp.status == status, body
    return body


def duck(db, text: str, params: list | None = None) -> list[list]:
    return [list(r) for r in db.execute(text, params or []).fetchall()]


def with_env(env: dict[str, str | None], start) -> None:
    """Run ``start`` (which spawns node processes) with these environment variables (None: unset)."""
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            if v is None:
                mp.delenv(k, raising=False)
            else:
                mp.setenv(k, v)
        start()


@pytest.fixture(scope="module")
def third_party_site(tmp_path_factory) -> Path:
    """The example plugin installed the way a third party's would be: pip, from its own directory."""
    site = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site),
                           str(EXAMPLE_PLUGIN)], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    assert list(site.glob("federator_keycount-*.dist-info"))
    return site


@pytest.fixture(scope="module")
def plugin_cluster(broker, tmp_path_factory, third_party_site):
    app_id = f"plg{uuid.uuid4().hex[:8]}"
    rnd = random.Random(11)
    lb = register(broker, app_id, {"name": "lb", "type": "leaderboard", "partitions": P,
                                   "key": {"name": "player", "format": "string"},
                                   "value": {"name": "score", "format": "long"}})
    scores = {f"player_{i:03d}": rnd.randrange(0, 150) for i in range(300)}  # plenty of ties
    records = [(p.encode(), p.encode(), lb.value.serialize(s), TS + i) for i, (p, s) in enumerate(scores.items())]
    # earlier scores that later records replace, and a player deleted again: the index must follow
    records = [(b"player_000", b"player_000", lb.value.serialize(10_000), TS - 1),
               (b"ghost", b"ghost", lb.value.serialize(99_999), TS - 1), (b"ghost", b"ghost", None, TS)] + records
    produce(broker, lb.topic, P, records)
    words = register(broker, app_id, {"name": "words", "type": "kv", "partitions": P,
                                      "key": {"name": "word", "format": "string"},
                                      "value": {"name": "n", "format": "long"}})
    vocab = [a + b + c for a in "abcpq" for b in "aeiopr" for c in ("", "ple", "ricot", "x", "é")]
    produce(broker, words.topic, P, [(w.encode(), w.encode(), words.value.serialize(len(w)), TS) for w in vocab])

    root = tmp_path_factory.mktemp("plugin-nodes")
    c = Cluster(broker.bootstrap_servers, app_id, root, size=3, standby_replicas=0)
    site = str(third_party_site)
    with_env({"PYTHONPATH": os.pathsep.join(filter(None, [site, os.environ.get("PYTHONPATH")])),
              "FEDERATOR_PLUGINS": None}, c.start)
    c.wait_settled("lb", P, timeout=60)
    c.wait_settled("words", P, timeout=60)
    db = duckdb.connect()
    db.register("lb", pa.table({"player": list(scores), "score": pa.array(list(scores.values()), pa.int64())}))
    db.register("words", pa.table({"word": vocab, "n": pa.array([len(w) for w in vocab], pa.int64())}))
    yield c, db, scores, broker, lb, root
    c.stop()


@pytest.mark.parametrize("text", [
    "SELECT player, score FROM lb ORDER BY score DESC, player LIMIT 10",
    "SELECT player, score FROM lb ORDER BY score, player DESC LIMIT 7 OFFSET 5",
    "SELECT player AS who, score * 2 AS doubled FROM lb ORDER BY score DESC, player LIMIT 25",
])
def test_top_k_equals_duckdb(plugin_cluster, text) -> None:
    c, db, *_ = plugin_cluster
    for node in c.nodes:
        got = sql(node, text)
        assert got["rows"] == duck(db, text)
        assert got["stats"]["partitions_queried"] == P


def test_top_k_is_planned_as_topk_queries(plugin_cluster) -> None:
    c, *_ = plugin_cluster
    plan = sql(c.nodes[0], "EXPLAIN SELECT player, score FROM lb ORDER BY score DESC LIMIT 3")
    cols = [col["name"] for col in plan["columns"]]
    rows = [dict(zip(cols, r)) for r in plan["rows"]]
    assert {r["query"] for r in rows} == {"TopKQuery(k=3, descending=True, distinct=False) via rule leaderboard.top_k: "
                                          "top 3 by score DESC from each partition's score index"}
    assert sorted(int(p) for r in rows for p in r["partitions"].split(",")) == list(range(P))
    # the index's rows per partition are the top-k already (rows_are_top_k): owners send them
    # as they are, and the receiver cuts once
    assert all(r["pushed_down"] == "columns player, score" for r in rows), rows
    assert all("ORDER BY score DESC LIMIT 3" in r["at_receiver"] for r in rows), rows


@pytest.mark.parametrize("players", [["player_007"], ["player_000", "player_123", "player_299", "nobody"]])
@pytest.mark.parametrize("direction", ["DESC", "ASC"])
def test_rank_equals_duckdb(plugin_cluster, players, direction) -> None:
    c, db, *_ = plugin_cluster
    marks = ", ".join("?" for _ in players)
    text = (f"SELECT player, score, RANK() OVER (ORDER BY score {direction}) AS rank FROM lb "
            f"QUALIFY player IN ({marks}) ORDER BY player")
    got = sql(c.nodes[1], text, players)
    assert got["rows"] == duck(db, text, players)
    assert [col["type"] for col in got["columns"]] == ["VARCHAR", "BIGINT", "BIGINT"]


def test_rank_of_one_player_and_its_plan(plugin_cluster) -> None:
    c, db, scores, *_ = plugin_cluster
    tied = next(p for p, s in scores.items() if list(scores.values()).count(s) > 1)
    text = "SELECT RANK() OVER (ORDER BY score DESC) AS r, player FROM lb QUALIFY player = ?"
    assert sql(c.nodes[2], text, [tied])["rows"] == duck(db, text, [tied])
    rows = sql(c.nodes[2], "EXPLAIN " + text, [tied])["rows"]
    # the player's partition says what ranks before it there; the others send their scores
    home = partition_for(tied.encode(), P)
    places, listed = ([r for r in rows if r[1].startswith(q)] for q in ("PlacesQuery", "ScoresQuery"))
    assert len(places) == 1 and places[0][1].startswith("PlacesQuery(players=('%s',)" % tied)
    assert places[0][2] == str(home)
    assert sorted(int(p) for r in listed for p in r[2].split(",")) == [p for p in range(P) if p != home]
    assert len(rows) == len(places) + len(listed)


def test_a_rank_asked_again_calls_the_players_partition_alone(plugin_cluster) -> None:
    """The node asked keeps the other partitions' scores while they have not moved: once its
    positions watches say so, a rank calls another node only when that node owns the player's
    partition, one call a rank, and every answer is still DuckDB's. (Each round ranks players
    not ranked before, whose whole answers no node has kept.)"""
    c, db, scores, *_ = plugin_cluster
    node = c.nodes[0]
    owners = c.active_map("lb", via=node)
    text = "SELECT player, score, RANK() OVER (ORDER BY score DESC) AS r FROM lb QUALIFY player = ?"
    rounds = iter([sorted(scores)[i:i + 6] for i in range(200, 300, 6)])  # players no other test asks

    def calls_as_kept() -> bool:
        players = next(rounds, None)
        if players is None:  # every round called more: the scores were not kept
            return False
        before = scrape(node)
        for p in players:
            assert sql(node, text, [p])["rows"] == duck(db, text, [p]), p
        calls = total(scrape(node), "federator_internal_calls_total", call="query") \
            - total(before, "federator_internal_calls_total", call="query")
        return calls == sum(owners[partition_for(p.encode(), P)] != node.node_id for p in players)

    wait_for(calls_as_kept, 20, "ranks that call the player's partition's owner alone")
    assert calls_as_kept() and calls_as_kept()


RANKS = [  # every shape the leaderboard's rank rule answers, in one direction or the other
    "SELECT player, score, RANK() OVER (ORDER BY score DESC) AS rank FROM lb QUALIFY player IN (?, ?, ?) "
    "ORDER BY player",
    "SELECT player, DENSE_RANK() OVER (ORDER BY score ASC) AS rank FROM lb QUALIFY player IN (?, ?, ?) ORDER BY player",
    "SELECT player, ROW_NUMBER() OVER (ORDER BY score DESC, player) AS n FROM lb QUALIFY player IN (?, ?, ?) "
    "ORDER BY player",
    "SELECT player, score, RANK() OVER (ORDER BY score DESC) AS rank FROM lb QUALIFY rank <= 7 "
    "ORDER BY rank, player",
    "SELECT player, score, DENSE_RANK() OVER (ORDER BY score DESC) AS rank FROM lb QUALIFY rank <= 3 "
    "ORDER BY rank, player",
]
AROUND = ("WITH me AS (SELECT RANK() OVER (ORDER BY score DESC) AS r FROM lb QUALIFY player = ?) "
          "SELECT player, score, RANK() OVER (ORDER BY score DESC) AS r FROM lb "
          "QUALIFY r BETWEEN (SELECT r FROM me) - 5 AND (SELECT r FROM me) + 5 ORDER BY r, player")


@pytest.mark.parametrize("text", RANKS + [AROUND])
def test_every_rank_shape_equals_duckdb_and_reads_no_whole_partition(plugin_cluster, text) -> None:
    c, db, *_ = plugin_cluster
    params = ["player_002", "player_150", "nobody"][:text.count("?")]
    for node in c.nodes:
        assert sql(node, text, params)["rows"] == duck(db, text, params)
    queries = {r[1].split("(")[0] for r in sql(c.nodes[0], "EXPLAIN " + text, params)["rows"]}
    assert queries <= {"KeysQuery", "RankQuery", "TopKQuery", "AroundQuery"}, queries


# asked between the ranks while scores are written: a top-k's partitions' answers are kept,
# and only the partitions a write moved are read again
FOLLOWED_TOPS = ["SELECT player, score FROM lb ORDER BY score DESC, player LIMIT 10"]


def test_ranks_and_top_k_follow_writes_as_of_their_token(plugin_cluster) -> None:
    """A producer writes scores while ranks and a top-k are asked, each with the token of the
    last write acknowledged: every answer shows that write, and equals DuckDB's over the rows
    as of the positions its own token names (read back from the changelog afterwards)."""
    c, db, scores, broker, lb, _ = plugin_cluster
    asked = ["player_002", "player_150", "player_299"]
    rnd = random.Random(4)
    acked: list[Position] = []
    stop = threading.Event()

    def writer() -> None:
        producer = kafka.producer(broker.bootstrap_servers, **{"linger.ms": 0})
        while not stop.is_set():
            player = rnd.choice(asked + [f"player_{rnd.randrange(300):03d}"])
            producer.produce(lb.topic, key=player.encode(), value=lb.value.serialize(rnd.randrange(0, 150)),
                             partition=partition_for(player.encode(), P), timestamp=TS + 50_000,
                             on_delivery=lambda err, m: acked.append(Position.of(m.topic(), m.partition(), m.offset())))
            producer.flush(10)
            time.sleep(0.01)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    answers: list[tuple[str, dict, Position]] = []
    try:
        wait_for(lambda: acked, 10, "a first write acknowledged")
        texts = RANKS + FOLLOWED_TOPS
        for i in range(48):
            text, wrote = texts[i % len(texts)], acked[-1]
            got = sql(c.nodes[i % 3], text, asked[:text.count("?")], consistency_token=wrote.to_token())
            read = Position.from_token(got["consistency_token"])
            assert read.merge(wrote) == read, "the answer is older than the write it was asked after"
            answers.append((text, got, read))
    finally:
        stop.set()
        thread.join(10)
    assert len({read.to_token() for _, _, read in answers}) > 10, "the answers were not read while writes went on"
    history = {p: read_partition(broker, lb.topic, p) for p in range(P)}
    for text, got, read in answers:
        rows = {}
        for p, records in history.items():
            for offset, key, value, _ in records:
                if offset <= (read.get(lb.topic, p) or -1):
                    rows[key.decode()] = None if value is None else lb.value.deserialize(value)
        at = duckdb.connect()
        live = {k: v for k, v in rows.items() if v is not None}
        at.register("lb", pa.table({"player": list(live), "score": pa.array(list(live.values()), pa.int64())}))
        assert got["rows"] == duck(at, text, asked[:text.count("?")]), text
    # the scores as the module's other tests know them
    written = sorted({key.decode() for records in history.values() for _, key, _, ts in records if ts == TS + 50_000})
    produce(broker, lb.topic, P, [(p.encode(), p.encode(), lb.value.serialize(scores[p]), TS + 60_000) for p in written])
    text = "SELECT player, score FROM lb ORDER BY score DESC, player LIMIT 300"
    wait_for(lambda: sql(c.nodes[0], text)["rows"] == duck(db, text), 30, "the module's scores back")


def test_other_sql_on_a_leaderboard_store_uses_the_kv_paths(plugin_cluster) -> None:
    c, db, *_ = plugin_cluster
    for text in ("SELECT player, score FROM lb WHERE player = 'player_042'",
                 "SELECT COUNT(*) AS n, SUM(score) AS s, MAX(score) AS m FROM lb",
                 "SELECT player FROM lb WHERE score > 140 ORDER BY player"):
        assert sql(c.nodes[0], text)["rows"] == duck(db, text)
    assert sql(c.nodes[0], "SELECT * FROM lb WHERE player = 'player_042'")["stats"]["partitions_queried"] == 1


def kept_hits(c) -> int:
    """Store queries the nodes answered from an answer kept at the same write sequence."""
    return sum(json.loads(HTTP.request("GET", f"http://{n.endpoint}/v1/metadata").data)["local"]["kept_answers"]["hits"]
               for n in c.nodes)


def test_the_index_follows_live_updates(plugin_cluster) -> None:
    c, db, scores, broker, lb, _ = plugin_cluster
    # a repeated top-k over unchanged partitions is answered from what each partition kept
    text = "SELECT player, score FROM lb ORDER BY score DESC, player LIMIT 4"
    assert sql(c.nodes[0], text)["rows"] == duck(db, text)
    before = kept_hits(c)
    assert sql(c.nodes[1], text)["rows"] == duck(db, text)
    assert kept_hits(c) >= before + P  # every partition's TopKQuery
    produce(broker, lb.topic, P, [(b"player_050", b"player_050", lb.value.serialize(1_000_000), TS + 10_000)])
    wait_for(lambda: sql(c.nodes[0], "SELECT player FROM lb ORDER BY score DESC LIMIT 1")["rows"] == [["player_050"]],
             30, "the new top score")
    got = sql(c.nodes[1], "SELECT RANK() OVER (ORDER BY score DESC) AS r FROM lb QUALIFY player = 'player_050'")
    assert got["rows"] == [[1]]
    produce(broker, lb.topic, P, [(b"player_050", b"player_050", lb.value.serialize(scores["player_050"]), TS + 20_000)])
    text = "SELECT player, score FROM lb ORDER BY score DESC, player LIMIT 5"
    wait_for(lambda: sql(c.nodes[0], text)["rows"] == duck(db, text), 30, "the old score back")


def test_prefix_scan_plugin_answers_like(plugin_cluster) -> None:
    c, db, *_ = plugin_cluster
    for text in ("SELECT word, n FROM words WHERE word LIKE 'pa%' ORDER BY word",
                 "SELECT COUNT(*) AS k FROM words WHERE word LIKE 'ap%' AND n > 2",
                 "SELECT word FROM words WHERE word LIKE 'zz%'"):
        assert sql(c.nodes[1], text)["rows"] == duck(db, text)
    plan = sql(c.nodes[1], "EXPLAIN SELECT word FROM words WHERE word LIKE 'ap%'")
    assert {r[1] for r in plan["rows"]} == {"PrefixScanQuery(prefix='ap') via rule prefix_scan.like: scan keys starting with 'ap'"}


def test_third_party_plugin_from_its_own_directory(plugin_cluster) -> None:
    c, db, *_ = plugin_cluster
    resp = HTTP.request("GET", f"http://{c.nodes[0].endpoint}/v1/plugins")
    plugins = {p["name"]: p for p in json.loads(resp.data)["plugins"]}
    assert plugins["keycount"]["distribution"] == "federator-keycount"
    assert "SQL rule keycount.count_star" in plugins["keycount"]["provides"]
    text = "SELECT COUNT(*) AS total FROM words"
    assert sql(c.nodes[2], text)["rows"] == duck(db, text)
    plan = sql(c.nodes[2], "EXPLAIN " + text)
    assert {r[1] for r in plan["rows"]} == {"KeyCountQuery() via rule keycount.count_star: count keys in each partition, add the counts"}


@pytest.mark.parametrize("text", [
    "WITH top AS (SELECT player, score FROM lb ORDER BY score DESC, player LIMIT 5) "
    "SELECT t.player, t.score, COUNT(w.word) AS shorter FROM top t LEFT JOIN words w ON LENGTH(w.word) * 30 < t.score "
    "GROUP BY t.player, t.score ORDER BY t.score DESC, t.player",
    "SELECT r.player, r.rank, w.n FROM (SELECT player, score, RANK() OVER (ORDER BY score DESC) AS rank FROM lb "
    "QUALIFY player IN ('player_007', 'player_123')) r CROSS JOIN (SELECT COUNT(*) AS n FROM words) w ORDER BY r.player",
])
def test_rule_answers_take_part_in_larger_statements(plugin_cluster, text) -> None:
    """A rule's rows (a top-k from the score index, ranks counted per partition) are one
    relation of a larger statement: joined, aggregated, ordered as DuckDB does."""
    c, db, *_ = plugin_cluster
    got = sql(c.nodes[1], text)
    assert got["rows"] == duck(db, text)
    plan = sql(c.nodes[1], "EXPLAIN " + text)
    assert any("via rule leaderboard." in row[1] for row in plan["rows"]), plan["rows"]


def test_a_node_without_the_plugins(plugin_cluster) -> None:
    """Runs last: a fourth node joins with no plugins at all."""
    c, _, _, broker, _, root = plugin_cluster
    bare = NodeProcess(broker.bootstrap_servers, c.nodes[0].app_id, "n3", root / "n3", standby_replicas=0)
    c.nodes.append(bare)
    with_env({"FEDERATOR_PLUGINS": ""}, bare.start)
    c.wait_settled("words", P, timeout=90)
    # The receiver has the rule; the node that owns some partitions does not know the query.
    err = sql(c.nodes[0], "SELECT word FROM words WHERE word LIKE 'ap%'", status=422)["error"]
    assert err["code"] == "UNKNOWN_QUERY_TYPE"
    assert "PrefixScanQuery" in err["message"] and "plugin 'prefix_scan'" in err["message"]
    assert "install the plugin 'prefix_scan' on every node" in err["message"]
    # The bare node cannot read a store whose type a plugin provides, and says so.
    err = sql(bare, "SELECT * FROM lb LIMIT 1", status=404)["error"]
    assert err["code"] == "UNKNOWN_STORE" and "'leaderboard'" in err["message"] and "install" in err["message"]
    # Plain SQL still works everywhere.
    assert sql(bare, "SELECT COUNT(*) AS n FROM words WHERE word >= 'a'")["rows"] == [[150]]
