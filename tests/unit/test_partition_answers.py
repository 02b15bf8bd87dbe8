"""Partition answers kept at the receiver (federator.dispatch.partition_answers, and
``Dispatcher.gather(keep_for=...)``): given again without a call while their partition is
where they were computed, asked again once it moves, its copy is reset, the caller reads
stale, or a consistency token asks for more."""

from __future__ import annotations

import threading
import time

import pyarrow as pa

from federator.catalog import StoreDefinition
from federator.dispatch.partition_answers import PartitionAnswers
from federator.partitioner import partition_for
from federator.plan.keys import SubQuery
from federator.query.position import PositionBound
from federator.query.queries import RangeQuery
from federator.route.read_options import ReadOptions
from tests.registry import REGISTRY
from tests.unit.memory_cluster import MemoryCluster
from tests.unit.test_engine import SCORES, P, World, duck  # noqa: F401 - the fixture

ALL = [SubQuery(RangeQuery(), None)]


def keys(gathered) -> list:
    return sorted(k for b in gathered.batches for k in b.column("key").to_pylist())


def asked(world: World) -> list[int]:
    return sorted(p for r in world.cluster.requests() for p in r.partitions)


def test_an_answer_is_given_again_until_its_partition_moves(duck) -> None:
    world = World(duck)
    try:
        dispatcher = world.cluster.engine().dispatcher
        first = dispatcher.gather("scores", P, ALL, None, ReadOptions(), keep_for=5)
        assert first.reused == 0 and asked(world) == list(range(P))
        world.cluster.forget()
        second = dispatcher.gather("scores", P, ALL, None, ReadOptions(), keep_for=5)
        assert second.reused == P and not world.cluster.requests()
        assert keys(second) == keys(first) and second.position == first.position
        moved = world.put("scores", 1_000_001, 7.0)
        world.cluster.forget()
        third = dispatcher.gather("scores", P, ALL, None, ReadOptions(), keep_for=5)
        assert asked(world) == [moved] and third.reused == P - 1
        defn = world.cluster.stores["scores"]
        in_moved = [k for k in keys(third) if partition_for(defn.key.serialize(k), P) == moved]
        assert third.refreshed_rows == len(in_moved) > 0  # that partition's answer, asked again
        assert first.refreshed_rows == second.refreshed_rows == 0
        assert keys(third) == sorted(keys(first) + [1_000_001]) and third.position != first.position
        # a token the kept answers reach is answered from them
        world.cluster.forget()
        tokened = dispatcher.gather("scores", P, ALL, None, ReadOptions(bound=PositionBound.at(third.position)),
                                    keep_for=5)
        assert tokened.reused == P and not world.cluster.requests()
    finally:
        world.cluster.close()


def test_the_states_a_statement_just_read_are_the_ones_its_answers_are_kept_by(duck) -> None:
    """The engine reads every partition's state once per statement (``known_positions``) and
    hands it over: the kept answers match those states, as the statement's own answer does."""
    world = World(duck)
    try:
        dispatcher = world.cluster.engine().dispatcher
        stores = [world.cluster.stores["scores"]]
        before = dispatcher.known_positions(stores)
        first = dispatcher.gather("scores", P, ALL, None, ReadOptions(), keep_for=5, known=before[0])
        world.put("scores", 1_000_001, 7.0)  # after the statement read its states
        world.cluster.forget()
        again = dispatcher.gather("scores", P, ALL, None, ReadOptions(), keep_for=5, known=before[0])
        assert again.reused == P and keys(again) == keys(first)  # the answer at those states
        now = dispatcher.gather("scores", P, ALL, None, ReadOptions(), keep_for=5,
                                known=dispatcher.known_positions(stores)[0])
        assert now.reused == P - 1 and 1_000_001 in keys(now)
    finally:
        world.cluster.close()


def test_answers_are_asked_for_when_not_to_be_kept(duck) -> None:
    world = World(duck)
    try:
        dispatcher = world.cluster.engine().dispatcher
        dispatcher.gather("scores", P, ALL, None, ReadOptions(), keep_for=5)
        for options, keep_for in ((ReadOptions(), 0.0), (ReadOptions(allow_stale=True), 5.0)):
            world.cluster.forget()
            assert dispatcher.gather("scores", P, ALL, None, options, keep_for=keep_for).reused == 0
            assert asked(world) == list(range(P))
        world.cluster.nodes["me"].materializer.epoch = 1  # a copy reset: its offsets may name other rows
        world.cluster.forget()
        assert dispatcher.gather("scores", P, ALL, None, ReadOptions(), keep_for=5).reused == 0
        world.cluster.forget()
        time.sleep(0.06)
        too_old = dispatcher.gather("scores", P, ALL, None, ReadOptions(), keep_for=0.05)
        assert too_old.reused == 0 and too_old.refreshed_rows == 0  # asked again, though nothing moved
        assert asked(world) == list(range(P))
    finally:
        world.cluster.close()


def test_kept_answers_are_bounded_by_bytes() -> None:
    batch = pa.record_batch([pa.array(range(1000), pa.int64())], names=["x"])  # 8,000 bytes
    kept = PartitionAnswers(max_bytes=4 * batch.nbytes)  # an answer may be a quarter of it
    for i in range(5):
        kept.put(i, "s", i, batch)
    assert len(kept) == 4 and kept.get(0, "s", 60) is None and kept.get(4, "s", 60) == (4, batch)
    assert kept.get(4, "other state", 60) is None and kept.get(4, "s", 60) is None  # dropped on a mismatch
    big = pa.record_batch([pa.array(range(1001), pa.int64())], names=["x"])
    kept.put("big", "s", 1, big)
    assert kept.get("big", "s", 60) is None  # one answer larger than an entry may be is not kept
    off = PartitionAnswers(max_bytes=0)  # --partition-answers-mb 0
    off.put("none", "s", 1, None)
    assert len(off) == 0


def test_gathers_at_once_share_one_call_per_partition(duck) -> None:
    """Two statements that want the same partition's answer at the same state while it is being
    asked for: one call, its answer handed to both (and kept)."""
    world = World(duck)
    try:
        dispatcher = world.cluster.engine().dispatcher
        dispatcher.gather("scores", P, ALL, None, ReadOptions(), keep_for=5)
        moved = world.put("scores", 1_000_001, 7.0)
        node = world.cluster.nodes["me"]
        execute = node.execute
        started = threading.Event()

        def slow(request):  # the owner takes a while: the second gather comes meanwhile
            started.set()
            time.sleep(0.3)
            return execute(request)

        node.execute = slow  # type: ignore[method-assign]
        world.cluster.forget()
        got: list = []
        first = threading.Thread(target=lambda: got.append(
            dispatcher.gather("scores", P, ALL, None, ReadOptions(), keep_for=5)))
        first.start()
        assert started.wait(5)
        got.append(dispatcher.gather("scores", P, ALL, None, ReadOptions(), keep_for=5))
        first.join(5)
        assert asked(world) == [moved]  # one call, though both wanted it
        assert all(keys(g) == keys(got[0]) for g in got) and 1_000_001 in keys(got[0])
        assert sorted(g.reused for g in got) == [P - 1, P]  # the second made no call at all
        assert not dispatcher._asking  # nothing left waiting
    finally:
        world.cluster.close()


def test_a_global_stores_answers_are_not_kept_per_partition(duck) -> None:
    """A global store's partitions are this node's own copies, and a query its store type reads
    together is answered whole by one partition's result: nothing is kept per partition."""
    defn = StoreDefinition.from_dict({**SCORES, "name": "dims", "global": True}, REGISTRY)
    cluster = MemoryCluster([defn], duck, ("me", "n2"))
    try:
        for k in range(-30, 30, 3):
            cluster.write("dims", k, k * 2.0)
        dispatcher = cluster.engine().dispatcher
        for _ in range(2):
            gathered = dispatcher.gather("dims", defn.partitions, ALL, None, ReadOptions(), keep_for=5)
            assert gathered.reused == 0 and keys(gathered) == list(range(-30, 30, 3))
        assert len(dispatcher.partition_answers) == 0
    finally:
        cluster.close()
