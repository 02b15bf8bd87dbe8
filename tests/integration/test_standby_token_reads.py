"""A read whose consistency token a standby already satisfies is served by the standby while the
active owner is gone, before the group has moved the partition; so is a read with allow_stale
within max_lag; a read with neither fails, naming exactly the partitions the owner took with it."""

from __future__ import annotations

import signal

import pytest

from federator.partitioner import partition_for
from tests.integration.changelog_util import register
from tests.integration.cluster import Cluster, wait_for, write_with_token

P = 4
pytestmark = pytest.mark.apache_kafka(long=True)  # on Apache Kafka by default: test_nodes.py's standbys


def unavailable(status: int, body: dict) -> tuple[list | None, str]:
    """The partitions and message of a 503 UNAVAILABLE answer (anything else fails)."""
    err = body.get("error") or {}
    assert (status, err.get("code")) == (503, "UNAVAILABLE"), f"not UNAVAILABLE but HTTP {status}: {body}"
    return err.get("partitions"), err["message"]


def test_a_token_read_is_served_by_the_standby_while_the_owner_is_dead(broker, app_id, tmp_path) -> None:
    defn = register(broker, app_id, {"name": "s", "type": "kv", "partitions": P,
                                     "key": {"format": "string"}, "value": {"format": "long"}})
    keys = [f"k{i}" for i in range(100)]
    write_with_token(broker.bootstrap_servers, defn, {k: 0 for k in keys})
    c = Cluster(broker.bootstrap_servers, app_id, tmp_path / "nodes", size=2, standby_replicas=1).start()
    try:
        owners = c.wait_settled("s", P)
        survivor, victim = c.nodes
        lost = sorted(p for p, n in owners.items() if n == victim.node_id)
        assert lost, owners
        key = next(k for k in keys if partition_for(k.encode(), P) in lost)
        token = write_with_token(broker.bootstrap_servers, defn, {k: 1000 + i for i, k in enumerate(keys)})
        assert sorted(token.partitions(defn.topic)) == list(range(P))  # the token names every partition
        point = f"SELECT value FROM s WHERE key = '{key}'"
        want = 1000 + keys.index(key)
        # the survivor's standby copies publish positions that reach the token, and no lag
        def standbys_caught_up() -> bool:
            (me,) = [n for n in survivor.metadata()["nodes"] if n["node_id"] == survivor.node_id]
            return all(me["positions"]["s"].get(str(p), -1) >= token.get(defn.topic, p)
                       and me["lags"]["s"].get(str(p)) == 0 for p in lost)

        wait_for(standbys_caught_up, 10, "the standby copies to reach the token")
        for n in c.nodes:  # (and the first SQL each node answers is behind us: it loads the engine)
            assert n.sql(point, consistency_token=token.to_token())[1]["rows"] == [[want]]

        victim.stop(signal.SIGKILL)
        status, body = survivor.sql(point, consistency_token=token.to_token(), timeout_ms=3000)
        assert status == 200, body
        assert body["rows"] == [[want]]
        total = [[len(keys), sum(range(1000, 1000 + len(keys)))]]
        status, body = survivor.sql("SELECT COUNT(*), SUM(value) FROM s", consistency_token=token.to_token(),
                                    timeout_ms=3000)
        assert status == 200, body
        assert body["rows"] == total
        # allow_stale within max_lag: the standby copies (lag 0) answer, without a token
        status, body = survivor.sql(point, allow_stale=True, max_lag=0, timeout_ms=3000)
        assert status == 200, body
        assert body["rows"] == [[want]]
        status, body = survivor.sql("SELECT COUNT(*) AS n, SUM(value) AS total FROM s", allow_stale=True, max_lag=0,
                                    timeout_ms=3000)
        assert status == 200, body
        assert body["rows"] == total
        # with neither, only the active copy will do and none answers yet: no partial answer, the
        # query fails naming exactly the partitions that went with the owner
        partitions, message = unavailable(*survivor.sql("SELECT SUM(value) AS total FROM s", timeout_ms=300))
        assert partitions == lost, message
        assert all(f"partition {p}:" in message for p in lost), message
        assert not any(f"partition {p}:" in message for p in set(range(P)) - set(lost)), message
        partitions, message = unavailable(*survivor.sql(point, timeout_ms=300))
        assert partitions == [partition_for(key.encode(), P)], message
        # all of that before the group gave the partitions to the survivor: it still holds them as
        # standby (had the group moved them, the reads above would not have tested a standby)
        (me,) = [n for n in survivor.metadata()["nodes"] if n["node_id"] == survivor.node_id]
        assert set(lost) <= set(me["standby"].get("s", [])) and not set(lost) & set(me["active"].get("s", [])), me

        # and after the rebalance the survivor answers as the owner
        wait_for(lambda: sorted(c.active_map("s", survivor)) == list(range(P)), 20, "the survivor to own all")
        assert survivor.sql(point)[1]["rows"] == [[want]]
    finally:
        c.stop()
