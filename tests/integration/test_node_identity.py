"""One live process per node id: a second live node with a taken id refuses to serve and exits;
a node restarted after its process died starts as usual."""

from __future__ import annotations

import signal

from federator.node_command import REFUSED
from federator.partitioner import partition_for
from federator.query import KeyQuery, StateQueryRequest
from tests.integration.changelog_util import produce, register
from tests.integration.cluster import NodeProcess, wait_for

P = 4


def _store(broker, app_id: str):
    defn = register(broker, app_id, {"name": "ids", "type": "kv", "partitions": P,
                                     "key": {"format": "string"}, "value": {"format": "long"}})
    enc = defn.value.serialize
    produce(broker, defn.topic, P, [(f"k{i}".encode(), f"k{i}".encode(), enc(i), 1) for i in range(50)])
    return defn


def _node(broker, app_id: str, node_id: str, root) -> NodeProcess:
    return NodeProcess(broker.bootstrap_servers, app_id, node_id, root / node_id, standby_replicas=0)


def _serves(node: NodeProcess) -> bool:
    if not node.ready():
        return False
    p = partition_for(b"k7", P)
    (r,) = node.client.query(StateQueryRequest("ids", KeyQuery("k7"), (p,), require_active=True))
    return r.ok and r.batch.column("value").to_pylist() == [7]


def _log(node: NodeProcess) -> str:
    return node.log.read_text()


def test_the_newer_of_two_live_nodes_with_one_id_refuses_and_a_restart_is_not_refused(broker, app_id, tmp_path) -> None:
    _store(broker, app_id)
    first = _node(broker, app_id, "n0", tmp_path / "a").start()
    twin = _node(broker, app_id, "n0", tmp_path / "b")
    try:
        wait_for(lambda: _serves(first), 30, "n0 to serve")

        # a second process with the same id: it says why and exits with REFUSED, having published nothing
        twin.start(wait=False)
        assert twin.proc.wait(30) == REFUSED, _log(twin)
        text = _log(twin)
        assert "refusing to serve" in text and f"already used by a live node at {first.endpoint}" in text, text
        assert "group assigned" not in text  # it never joined the group
        # the first one never noticed: it serves, and every view of n0 is still the first process
        assert _serves(first)
        (me,) = [n for n in first.metadata()["nodes"] if n["node_id"] == "n0"]
        assert me["endpoint"] == first.endpoint and me["active"]["ids"] == list(range(P))

        # the process dies; a restart with the same id and state dir (new port) must not be refused
        # by the record its dead predecessor left, however soon it comes
        first.stop(signal.SIGKILL)
        again = NodeProcess(broker.bootstrap_servers, app_id, "n0", first.state_dir, standby_replicas=0)
        twin = again  # stopped at the end
        again.start()
        wait_for(lambda: _serves(again), 30, "the restarted n0 to serve")
        assert "refusing" not in _log(again)
        (me,) = [n for n in again.metadata()["nodes"] if n["node_id"] == "n0"]
        assert me["endpoint"] == again.endpoint
    finally:
        first.stop()
        twin.stop()


def test_two_nodes_started_together_with_one_id_leave_exactly_one_serving(broker, app_id, tmp_path) -> None:
    _store(broker, app_id)
    a, b = _node(broker, app_id, "n1", tmp_path / "a"), _node(broker, app_id, "n1", tmp_path / "b")
    try:
        a.start(wait=False)
        b.start(wait=False)
        loser = wait_for(lambda: next((n for n in (a, b) if n.proc.poll() is not None), None), 40,
                         "one of the two to refuse")
        winner = b if loser is a else a
        assert loser.proc.returncode == REFUSED, _log(loser)
        assert "refusing to serve" in _log(loser)
        # The twins joined the group together and one left mid-join: the broker's next join took
        # over 30 s once (tansu), so the survivor gets the time a rebalance can take there.
        try:
            wait_for(lambda: _serves(winner), 90, "the other one to serve")
        except AssertionError as e:
            raise AssertionError(f"{e}\n--- the survivor's log ---\n{_log(winner)}\n--- the twin's log ---\n{_log(loser)}") from None
        assert winner.proc.poll() is None
    finally:
        a.stop()
        b.stop()
