"""`federator store create|list|describe` against the real broker."""

from __future__ import annotations

import json
import subprocess

from federator import kafka
from federator.catalog import Catalog
from tests.conftest import federator_cmd
from tests.registry import REGISTRY


def run(broker, app_id: str, *args: str) -> subprocess.CompletedProcess:
    cmd = federator_cmd(*args[:2], *args[2:], "--bootstrap-servers", broker.bootstrap_servers, "--application-id", app_id)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def test_create_list_describe(broker, app_id) -> None:
    r = run(broker, app_id, "store", "create", "word_counts", "--type", "kv", "--partitions", "8", "--key", "string", "--value", "long")
    assert r.returncode == 0, r.stderr
    assert f"topic {app_id}-word_counts-changelog, 8 partitions" in r.stdout
    r = run(broker, app_id, "store", "create", "player_stats", "--type", "kv", "--partitions", "8", "--key", "string",
            "--key-name", "player", "--value-fields", "games:long,total_score:long,best_score:long,last_seen:timestamp")
    assert r.returncode == 0, r.stderr
    r = run(broker, app_id, "store", "create", "scores_per_minute", "--type", "window", "--partitions", "8",
            "--key", "string", "--value", "long", "--window-size-ms", "60000")
    assert r.returncode == 0, r.stderr
    r = run(broker, app_id, "store", "create", "teams", "--type", "kv", "--partitions", "2", "--key", "string",
            "--value", "string", "--value-name", "city", "--global")
    assert r.returncode == 0, r.stderr
    assert "2 partitions, global (every node keeps every partition)" in r.stdout

    adm = kafka.admin(broker.bootstrap_servers)
    assert kafka.topic_partitions(adm, f"{app_id}-word_counts-changelog") == 8
    assert kafka.topic_partitions(adm, f"{app_id}-catalog") == 1

    r = run(broker, app_id, "store", "list")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["NAME", "TYPE", "PARTITIONS", "SCOPE", "KEY", "VALUE", "TOPIC"]
    assert [ln.split()[:4] for ln in lines[1:]] == [["player_stats", "kv", "8", "partitioned"],
                                                    ["scores_per_minute", "window", "8", "partitioned"],
                                                    ["teams", "kv", "2", "global"], ["word_counts", "kv", "8", "partitioned"]]

    r = run(broker, app_id, "store", "list", "--json")
    defs = {d["name"]: d for d in map(json.loads, r.stdout.splitlines())}
    assert defs["scores_per_minute"]["window_size_ms"] == 60000
    assert defs["teams"]["global"] is True and "global" not in defs["word_counts"]
    assert defs["player_stats"]["key"] == {"name": "player", "format": "string"}
    assert [f["name"] for f in defs["player_stats"]["value"]["fields"]] == ["games", "total_score", "best_score", "last_seen"]

    r = run(broker, app_id, "store", "describe", "player_stats")
    assert r.returncode == 0, r.stderr
    assert "player: string" in r.stdout and "last_seen: timestamp[ms, tz=UTC]" in r.stdout and "rowtime" in r.stdout

    # every other client sees the same catalog
    stores = Catalog(broker.bootstrap_servers, app_id, REGISTRY).load()
    assert set(stores) == {"word_counts", "player_stats", "scores_per_minute", "teams"}
    assert stores["teams"].is_global and not stores["word_counts"].is_global
    assert stores["player_stats"].value_columns == ["games", "total_score", "best_score", "last_seen"]


def test_same_definition_succeeds_and_a_different_one_says_what_differs(broker, app_id) -> None:
    args = ("store", "create", "s", "--type", "kv", "--partitions", "4", "--key", "long", "--value", "string")
    assert run(broker, app_id, *args).returncode == 0
    again = run(broker, app_id, *args)
    assert again.returncode == 0, again.stderr
    assert "already exists with this definition" in again.stdout

    other = run(broker, app_id, "store", "create", "s", "--type", "kv", "--partitions", "6", "--key", "string", "--value", "string")
    assert other.returncode == 2
    assert "partitions: 4 vs 6" in other.stderr
    assert "key.format: 'long' vs 'string'" in other.stderr
    assert Catalog(broker.bootstrap_servers, app_id, REGISTRY).get("s").partitions == 4


def test_bad_definitions_name_the_field_and_create_nothing(broker, app_id) -> None:
    cases = [
        (("--type", "kv", "--partitions", "0", "--key", "string", "--value", "long"), "'partitions'"),
        (("--type", "tree", "--partitions", "2", "--key", "string", "--value", "long"), "'type'"),
        (("--type", "kv", "--partitions", "2", "--key", "uuid", "--value", "long"), "'key.format'"),
        (("--type", "window", "--partitions", "2", "--key", "string", "--value", "long"), "'window_size_ms'"),
        (("--type", "kv", "--partitions", "2", "--key", "string", "--value-fields", "a:decimal"), "'value.fields'"),
        (("--type", "kv", "--partitions", "2", "--key", "string", "--value-fields", "rowtime:long"), "reserved"),
    ]
    for args, field in cases:
        r = run(broker, app_id, "store", "create", "bad", *args)
        assert r.returncode == 2, (args, r.stdout)
        assert field in r.stderr, (args, r.stderr)
        assert "Traceback" not in r.stderr
    assert Catalog(broker.bootstrap_servers, app_id, REGISTRY).load() == {}
    assert kafka.topic_partitions(kafka.admin(broker.bootstrap_servers), f"{app_id}-bad-changelog") is None


def test_an_existing_topic_can_be_named_and_must_match(broker, app_id) -> None:
    adm = kafka.admin(broker.bootstrap_servers)
    kafka.ensure_topic(adm, f"{app_id}-streams-app-counts-changelog", 3)
    ok = run(broker, app_id, "store", "create", "counts", "--type", "kv", "--partitions", "3", "--key", "string",
             "--value", "long", "--topic", f"{app_id}-streams-app-counts-changelog")
    assert ok.returncode == 0, ok.stderr
    mismatch = run(broker, app_id, "store", "create", "counts2", "--type", "kv", "--partitions", "5", "--key", "string",
                   "--value", "long", "--topic", f"{app_id}-streams-app-counts-changelog")
    assert mismatch.returncode == 2
    assert "exists with 3 partitions, not 5" in mismatch.stderr
    assert "counts2" not in Catalog(broker.bootstrap_servers, app_id, REGISTRY).load()


def test_describe_unknown_store_and_unreachable_broker(broker, app_id) -> None:
    r = run(broker, app_id, "store", "describe", "nope")
    assert r.returncode == 2 and "no store 'nope'" in r.stderr and "federator store list" in r.stderr
    r = subprocess.run(
        federator_cmd("store", "list", "--bootstrap-servers", "127.0.0.1:1", "--application-id", app_id),
        capture_output=True, text=True, timeout=60,
    )
    assert r.returncode == 2
    assert "no Kafka broker answers at 127.0.0.1:1" in r.stderr and "federator broker" in r.stderr


def test_a_catalog_reads_again_before_registering_and_sees_another_writer(broker, app_id) -> None:
    """A Catalog keeps its admin client and checks its topic once; its later reads and its
    register still see what another writer recorded in between."""
    from federator.catalog import CatalogConflict, StoreDefinition, changelog_topic

    def defn(partitions: int) -> StoreDefinition:
        return StoreDefinition(name="s", type="kv", topic=changelog_topic(app_id, "s"), partitions=partitions,
                               key_format="string", value_format="long", types=REGISTRY)

    mine, other = Catalog(broker.bootstrap_servers, app_id, REGISTRY), Catalog(broker.bootstrap_servers, app_id, REGISTRY)
    assert mine.load() == {}
    assert other.register(defn(4)) is True
    assert mine.load()["s"].partitions == 4
    assert mine.register(defn(4)) is False
    try:
        mine.register(defn(6))
    except CatalogConflict as e:
        assert "partitions: 4 vs 6" in str(e)
    else:
        raise AssertionError("registering another definition of an existing store must fail")
    assert Catalog(broker.bootstrap_servers, app_id, REGISTRY).get("s").partitions == 4
