"""Nodes as subprocesses over the real broker: ownership, handover, standbys, restarts, rebuilds."""

from __future__ import annotations

import random
import re
import signal
import threading
import time
from collections import Counter

import pytest
import urllib3

from federator.dispatch import NodeCallError, NodeClient
from federator.cluster.membership import HEARTBEAT_SECONDS, nodes_topic
from federator.partitioner import partition_for
from federator.query.wire import SECRET_HEADER
from federator.query import FailureReason, KeyQuery, RangeQuery, StateQueryRequest
from tests.conftest import RunningBroker, free_port
from tests.integration.changelog_util import produce, read_partition, register
from tests.integration.cluster import Cluster, NodeProcess, wait_for
from tests.threads import Worker, join_all

P = 8
SECRET = "s3cret-of-the-test-cluster"


def make_store(broker, app_id: str, name: str = "counts"):
    return register(broker, app_id, {"name": name, "type": "kv", "partitions": P,
                                     "key": {"format": "string"}, "value": {"format": "long"}})


def write(broker, defn, model: dict[str, int]) -> None:
    enc = defn.value.serialize
    produce(broker, defn.topic, P, [(k.encode(), k.encode(), enc(v), 1) for k, v in model.items()])


def ask(node: NodeProcess, store: str, key: str, require_active: bool = True):
    p = partition_for(key.encode(), P)
    (r,) = node.client.query(StateQueryRequest(store, KeyQuery(key), (p,), require_active=require_active))
    return r


def membership_records(broker, app_id: str) -> int:
    """Records in the nodes' heartbeat topic."""
    return len(read_partition(broker, nodes_topic(app_id), 0))


def value_of(r) -> int | None:
    assert r.ok, r
    vals = r.batch.column("value").to_pylist()
    return vals[0] if vals else None


@pytest.fixture
def cluster(broker, app_id, tmp_path):
    clusters: list[Cluster] = []

    def make(size: int = 3, standby_replicas: int = 1, secret: str | None = SECRET, bootstrap: str | None = None):
        c = Cluster(bootstrap or broker.bootstrap_servers, app_id, tmp_path / "nodes", size, standby_replicas, secret)
        clusters.append(c)
        return c.start()

    yield make
    for c in clusters:
        c.stop()


@pytest.mark.apache_kafka(long=True)  # every Apache Kafka test below joins nodes too
def test_three_nodes_split_eight_partitions_and_each_owner_answers(broker, app_id, cluster) -> None:
    defn = make_store(broker, app_id)
    model = {f"user-{i}": i for i in range(2000)}
    write(broker, defn, model)
    c = cluster()
    owners = c.wait_settled("counts", P)
    assert sorted(Counter(owners.values()).values()) == [2, 3, 3]
    by_id = {n.node_id: n for n in c.nodes}

    for key in random.Random(3).sample(sorted(model), 150):
        p = partition_for(key.encode(), P)
        owner = by_id[owners[p]]
        assert value_of(ask(owner, "counts", key)) == model[key]
        # any node routes the key the same way (IQv2's queryMetadataForKey)
        status, meta = random.choice(c.nodes).client.get_json(f"/v1/metadata/stores/counts/keys/{key}")
        assert status == 200 and meta["partition"] == p and meta["active"]["node_id"] == owner.node_id
        assert [s["node_id"] for s in meta["standbys"]] and owner.node_id not in [s["node_id"] for s in meta["standbys"]]

    # a full scan through the owners returns exactly what was written
    rows = {}
    for node in c.nodes:
        mine = tuple(p for p, n in owners.items() if n == node.node_id)
        for r in node.client.query(StateQueryRequest("counts", RangeQuery(), mine, require_active=True)):
            assert r.ok, r
            rows.update(zip(r.batch.column("key").to_pylist(), r.batch.column("value").to_pylist()))
    assert rows == model

    # the standby answers stale reads, refuses when an active is required; others say NOT_PRESENT
    key = "user-7"
    p = partition_for(key.encode(), P)
    _, meta = c.nodes[0].client.get_json(f"/v1/metadata/stores/counts/keys/{key}")
    standby = by_id[meta["standbys"][0]["node_id"]]
    assert ask(standby, "counts", key).failure is FailureReason.NOT_ACTIVE
    assert value_of(ask(standby, "counts", key, require_active=False)) == 7
    stranger = next(n for n in c.nodes if n.node_id not in (owners[p], standby.node_id))
    assert ask(stranger, "counts", key, require_active=False).failure is FailureReason.NOT_PRESENT

    # internal calls need the cluster secret
    with pytest.raises(NodeCallError) as e:
        NodeClient(c.nodes[0].endpoint).query(StateQueryRequest("counts", KeyQuery(key), (p,)))
    assert e.value.status == 403

    # a settled cluster beats about once a second per node; a beat does not answer a beat
    # (the nodes once echoed each other's beats, ~10 a second each, and kept the broker busy)
    before, started = membership_records(broker, app_id), time.monotonic()
    time.sleep(4)
    beats = membership_records(broker, app_id) - before
    assert beats <= len(c.nodes) * ((time.monotonic() - started) / HEARTBEAT_SECONDS + 2), beats


@pytest.mark.apache_kafka(long=True)  # on Apache Kafka by default: the SIGTERM and SIGKILL of the test below
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_stopped_node_hands_over_and_standbys_serve_meanwhile(broker, app_id, cluster, sig) -> None:
    defn = make_store(broker, app_id)
    model = {f"k{i}": i * 3 for i in range(800)}
    write(broker, defn, model)
    c = cluster()
    owners = c.wait_settled("counts", P)
    victim = c.nodes[1]
    lost = sorted(p for p, n in owners.items() if n == victim.node_id)
    keys = [k for k in model if partition_for(k.encode(), P) in lost][:40]
    standby_of: dict[int, str] = {}

    def standbys_placed() -> bool:  # standbys are placed after the actives settle
        md = c.nodes[0].metadata()
        standby_of.clear()
        standby_of.update({p: n["node_id"] for n in md["nodes"] for p in n["standby"].get("counts", [])})
        return all(p in standby_of for p in lost)

    wait_for(standbys_placed, 60, "a standby of each of the victim's partitions")
    by_id = {n.node_id: n for n in c.nodes}

    victim.stop(sig)
    # meanwhile: the standbys answer stale reads with the right data
    for k in keys:
        holder = by_id[standby_of[partition_for(k.encode(), P)]]
        assert value_of(ask(holder, "counts", k, require_active=False)) == model[k]
    # and the survivors take every partition over
    survivors = c.running()
    wait_for(lambda: sorted(c.active_map("counts", survivors[0])) == list(range(P))
             and set(c.active_map("counts", survivors[0]).values()) <= {n.node_id for n in survivors},
             60, "the survivors to own every partition")
    owners = c.wait_settled("counts", P)
    for k in keys:
        assert value_of(ask(by_id[owners[partition_for(k.encode(), P)]], "counts", k)) == model[k]


@pytest.mark.apache_kafka(long=True)
def test_a_restarted_node_restores_from_its_checkpoint(broker, app_id, cluster) -> None:
    defn = make_store(broker, app_id)
    model = {f"k{i}": i for i in range(3000)}
    write(broker, defn, model)
    c = cluster(standby_replicas=0)
    c.wait_settled("counts", P)
    node = c.nodes[2]
    first_run = sum(node.metadata()["local"]["records_applied"].values())
    assert first_run > 0
    node.stop()
    update = {f"k{i}": -i for i in range(0, 3000, 30)}  # 100 new records
    write(broker, defn, update)
    model.update(update)
    node.start()
    owners = c.wait_settled("counts", P)
    applied = node.metadata()["local"]["records_applied"]
    assert applied, "the restarted node hosts nothing"
    mine = [int(k.split("/")[1]) for k in applied]
    new_in_mine = sum(1 for k in update if partition_for(k.encode(), P) in mine)
    # only the records written while it was down, not the 3000 + 100 of the whole changelog
    assert sum(applied.values()) == new_in_mine
    by_id = {n.node_id: n for n in c.nodes}
    for k in list(update)[:30]:
        assert value_of(ask(by_id[owners[partition_for(k.encode(), P)]], "counts", k)) == model[k]


def test_a_node_started_with_a_config_file_serves_with_its_settings(broker, app_id, tmp_path) -> None:
    """What --config FILE names reaches the running node (its SQL cap, its cluster secret, its
    scan cache's budget), and a flag given as well wins over the file."""
    config = tmp_path / "node.toml"
    config.write_text(f'cluster_secret = "{SECRET}"\nmax_sql_chars = 40\nscan_cache_mb = 7\n')
    node = NodeProcess(broker.bootstrap_servers, app_id, "configured", tmp_path / "configured", standby_replicas=0)
    node.extra_args = ["--config", str(config), "--scan-cache-mb", "9"]
    try:
        node.start()
        status, body = node.sql("SELECT 1 AS one, 2 AS two, 3 AS three, 4 AS four")
        assert status == 400 and "--max-sql-chars" in body["error"]["message"], body
        assert node.sql("SELECT 1 AS one")[0] == 200
        http = urllib3.PoolManager(retries=False)
        metrics = http.request("GET", f"http://{node.endpoint}/metrics").data.decode()
        budget = re.search(r"^federator_scan_cache_max_bytes (\S+)$", metrics, re.MULTILINE)
        assert budget is not None and float(budget.group(1)) == 9 * 1024 * 1024
        internal = f"http://{node.endpoint}/internal/v1/query"
        assert http.request("POST", internal, body=b"{}").status == 403  # the file's secret guards it
        assert http.request("POST", internal, body=b"{}", headers={SECRET_HEADER: SECRET}).status != 403
    finally:
        assert node.stop() == 0


def test_the_broker_restarted_empty_never_serves_old_data_and_rebuilds(app_id, tmp_path) -> None:
    """The nodes' shards outlive the broker's data: after it restarts empty and the store is
    registered again, the nodes must serve the store (empty at first, then the new data) and
    never the old rows as current. Old rows have value 1; new ones value 2, on a third of the keys."""
    b = RunningBroker(free_port(), tmp_path / "broker.log")
    nodes: list[NodeProcess] = []
    try:
        defn = make_store(b, app_id)
        write(b, defn, {f"k{i}": 1 for i in range(300)})
        c = Cluster(b.bootstrap_servers, app_id, tmp_path / "nodes", size=2, standby_replicas=0)
        nodes = c.nodes
        c.start()
        owners = c.wait_settled("counts", P)
        by_id = {n.node_id: n for n in c.nodes}
        assert value_of(ask(by_id[owners[partition_for(b"k1", P)]], "counts", "k1")) == 1

        b.stop(signal.SIGKILL)
        from federator.broker import port_open

        wait_for(lambda: not port_open("127.0.0.1", b.port), 10, "the killed broker to let go of its port")
        b = RunningBroker(b.port, tmp_path / "broker-again.log")  # the same address, nothing in it
        # the pipeline registers its store again: a new, empty changelog under the old name
        defn = make_store(b, app_id)
        seen: Counter = Counter()

        def served(allowed: dict[str, int]) -> dict[int, dict[str, int]]:
            """partition -> its rows, from every node that answers it as current; any row that is
            not in ``allowed`` is old data served as current, and fails the test at once."""
            out: dict[int, dict[str, int]] = {}
            for n in c.nodes:
                try:
                    results = n.client.query(StateQueryRequest("counts", RangeQuery(), require_active=True))
                except NodeCallError as e:  # the catalog was gone for a while: the store unknown
                    assert e.code == "UNKNOWN_STORE", e
                    seen[e.code] += 1
                    continue
                for r in results:
                    seen["ok" if r.ok else r.failure.value] += 1
                    if r.ok:
                        rows = dict(zip(r.batch.column("key").to_pylist(), r.batch.column("value").to_pylist()))
                        old = {k: v for k, v in rows.items() if allowed.get(k) != v}
                        assert not old, f"{n.node_id} served old data as current in partition {r.partition}: {old}"
                        out[r.partition] = rows
            return out

        # the nodes serve the store again, empty (so they did answer while old rows were on disk)
        try:
            wait_for(lambda: sorted(served({})) == list(range(P)), 60,
                     "every partition to be served (empty) from the new broker", interval=0.3)
        except AssertionError as e:
            raise AssertionError(f"{e}; answers seen: {dict(seen)}") from None
        # and rebuild from the new changelog: the new data, never the old
        new = {f"k{i}": 2 for i in range(0, 300, 3)}
        write(b, defn, new)

        def rebuilt() -> bool:
            parts = served(new)
            return sorted(parts) == list(range(P)) and {k: v for rows in parts.values() for k, v in rows.items()} == new

        try:
            wait_for(rebuilt, 60, "the nodes to serve the new changelog's data", interval=0.3)
        except AssertionError as e:
            raise AssertionError(f"{e}; answers seen: {dict(seen)}") from None
    finally:
        for n in nodes:
            n.stop()
        b.stop()


@pytest.mark.apache_kafka
def test_queries_racing_a_rebalance_get_right_data_or_typed_failures(broker, app_id, cluster) -> None:
    defn = make_store(broker, app_id)
    model = {f"k{i}": i * 7 for i in range(1000)}
    write(broker, defn, model)
    c = cluster()
    c.wait_settled("counts", P)
    outcomes: Counter = Counter()
    wrong: list[str] = []
    stop = threading.Event()

    def hammer() -> None:
        rnd = random.Random(5)
        owners: dict[int, str] = {}
        while not stop.is_set():
            key = rnd.choice(sorted(model))
            p = partition_for(key.encode(), P)
            alive = {n.node_id: n for n in c.running()}
            node = alive.get(owners.get(p, ""), None) or rnd.choice(list(alive.values()))
            try:
                r = ask(node, "counts", key, require_active=rnd.random() < 0.5)
            except NodeCallError:
                outcomes["node-down"] += 1
                continue
            if r.ok:
                got = value_of(r)
                if got != model[key]:
                    wrong.append(f"{key}: {got} != {model[key]} from {node.node_id}")
                outcomes["ok"] += 1
            else:
                assert isinstance(r.failure, FailureReason), r
                outcomes[r.failure.value] += 1
                try:
                    owners = c.active_map("counts", node)
                except NodeCallError:
                    pass

    def answered_more(n: int = 30) -> None:
        """Wait until the hammer has had ``n`` more right answers (it is running, not stuck)."""
        seen = outcomes["ok"]
        wait_for(lambda: outcomes["ok"] >= seen + n or not t.is_alive(), 60, f"{n} more answers ({dict(outcomes)})")
        if not t.is_alive():  # the hammer failed: say why now, not after the remaining steps
            join_all([t], 0)
            raise AssertionError(f"the hammer stopped ({dict(outcomes)})")

    def owned_by(nodes: list[NodeProcess]) -> bool:
        owners = c.active_map("counts", nodes[0])
        return sorted(owners) == list(range(P)) and set(owners.values()) <= {n.node_id for n in nodes}

    t = Worker(hammer)
    t.start()
    try:
        # each step waits for the state it brings about, with the hammer answering throughout
        answered_more()
        c.nodes[2].stop(signal.SIGTERM)
        wait_for(lambda: owned_by(c.nodes[:2]), 60, "n0 and n1 to own every partition")
        answered_more()
        c.nodes[2].start()
        c.wait_settled("counts", P, timeout=60)
        answered_more()
        c.nodes[0].stop(signal.SIGKILL)
        wait_for(lambda: owned_by(c.nodes[1:]), 60, "n1 and n2 to own every partition")
        answered_more()
    finally:
        stop.set()
        join_all([t], 30)  # what failed in the hammer fails the test
    assert not wrong, wrong[:5]
    assert outcomes["ok"] > 50, outcomes
