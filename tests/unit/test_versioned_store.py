"""Versioned stores on real RocksDB: the latest value is the newest timestamp's, not the last offset's."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from federator.query import KeyQuery, RangeQuery
from federator.store import ChangelogRecord
from tests.unit.test_shard import col, definition, ms, ok, open_shard, rec  # noqa: F401  (fixtures)


def versioned():
    return definition("versioned")


def test_a_late_record_is_history_not_the_latest_value(open_shard, rec) -> None:
    shard = open_shard(versioned())
    shard.apply([rec(b"a", b"new", 2_000), rec(b"a", b"old", 1_000)])  # in one batch
    shard.apply([rec(b"a", b"older", 500)])  # and in the next
    assert ok(shard, KeyQuery("a")) == [{"k": "a", "v": "new", "rowtime": ms(2_000)}]
    assert shard.offset == 2  # the late records were read, and the position moved past them


def test_a_record_of_the_same_timestamp_replaces_the_latest(open_shard, rec) -> None:
    shard = open_shard(versioned())
    shard.apply([rec(b"a", b"first", 2_000)])
    shard.apply([rec(b"a", b"second", 2_000)])
    assert col(ok(shard, KeyQuery("a")), "v") == ["second"]


def test_a_delete_holds_against_older_versions_and_gives_way_to_newer(open_shard, rec) -> None:
    shard = open_shard(versioned())
    shard.apply([rec(b"a", b"v1", 1_000), rec(b"b", b"kept", 3_000)])
    shard.apply([rec(b"a", None, 2_000), rec(b"b", None, 2_500)])  # b's delete is older than b's value
    shard.apply([rec(b"a", b"late", 1_500)])  # older than a's delete: history
    assert col(ok(shard, RangeQuery()), "k") == ["b"]
    shard.apply([rec(b"a", b"v2", 2_001)])
    assert ok(shard, RangeQuery()) == [{"k": "a", "v": "v2", "rowtime": ms(2_001)},
                                        {"k": "b", "v": "kept", "rowtime": ms(3_000)}]


def test_what_a_key_holds_survives_a_restart(open_shard, rec) -> None:
    defn = versioned()
    first = open_shard(defn, "shard")
    first.apply([rec(b"a", b"new", 2_000), rec(b"b", None, 5_000)])
    first.close()
    again = open_shard(defn, "shard")
    again.apply([rec(b"a", b"old", 1_000), rec(b"b", b"old", 4_000)])
    assert ok(again, RangeQuery()) == [{"k": "a", "v": "new", "rowtime": ms(2_000)}]


_VERSIONS = st.lists(st.tuples(st.sampled_from([b"a", b"b", b"c"]), st.one_of(st.none(), st.sampled_from([b"x", b"y"])),
                               st.integers(0, 5)), max_size=30)


@given(versions=_VERSIONS, cuts=st.lists(st.integers(0, 30), max_size=4))
def test_the_latest_values_are_a_function_of_the_versions_in_any_batching(tmp_path_factory, versions, cuts) -> None:
    """Per key, the value of the newest timestamp (the later of equal ones), nothing if that is a
    delete, however the changelog's records fall into batches."""
    from federator.store import Shard

    records = [ChangelogRecord(k, v, i, t) for i, (k, v, t) in enumerate(versions)]
    shard = Shard(tmp_path_factory.mktemp("versioned"), versioned(), 1)
    try:
        bounds = sorted({0, len(records), *(c for c in cuts if c <= len(records))})
        for lo, hi in zip(bounds, bounds[1:]):
            shard.apply(records[lo:hi])
        latest: dict[bytes, ChangelogRecord] = {}
        for r in records:
            if r.key not in latest or r.timestamp >= latest[r.key].timestamp:
                latest[r.key] = r
        expected = [{"k": k.decode(), "v": r.value.decode(), "rowtime": ms(r.timestamp)}
                    for k, r in sorted(latest.items()) if r.value is not None]
        assert ok(shard, RangeQuery()) == expected
    finally:
        shard.close()
