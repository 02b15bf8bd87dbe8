"""A kept full scan brought up to date from the writes applied since equals reading the shard
again, for any sequence of upserts and deletes, and the shard never answers from it with
data older or newer than the position it reports."""

from __future__ import annotations

import struct
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from federator.catalog import StoreDefinition
from federator.query.queries import RangeQuery
from federator.store.record import ChangelogRecord
from federator.store.scan_cache import CachingLayer, ScanCache
from federator.store.shard import Shard
from tests.registry import REGISTRY

FAST = settings(max_examples=15, deadline=None)
KEYS = {
    "string": st.text(max_size=4),
    "bytes": st.binary(max_size=4),
    "long": st.integers(-(1 << 63), (1 << 63) - 1),
    "int": st.integers(-(1 << 31), (1 << 31) - 1),
}


def _definition(key_format: str) -> StoreDefinition:
    return StoreDefinition.from_dict({"name": "s", "type": "kv", "topic": "t", "partitions": 1,
                                      "key": {"name": "k", "format": key_format},
                                      "value": {"name": "v", "format": "long"}}, REGISTRY)


def _cached(path: Path, defn: StoreDefinition, cache: ScanCache) -> CachingLayer:
    return CachingLayer(Shard(path, defn, 0), cache)


def _scan(store: CachingLayer) -> tuple[pa.RecordBatch, object]:
    result = store.run(RangeQuery())
    assert result.ok, result.message
    return result.batch, result.position


def _full_scan(shard: Shard) -> pa.RecordBatch:
    return shard.store_type.handler_for(RangeQuery())(shard._view(), RangeQuery())


@pytest.mark.parametrize("probe", ["binary search", "hash"])  # how written keys are found in the scan
@pytest.mark.parametrize("key_format", sorted(KEYS))
@FAST
@given(data=st.data())
def test_a_followed_scan_equals_reading_the_shard(tmp_path_factory, key_format: str, probe: str, data) -> None:
    from federator.store import kv

    bisect_max = kv._BISECT_MAX
    kv._BISECT_MAX = bisect_max if probe == "binary search" else -1
    defn = _definition(key_format)
    cache = ScanCache(256 << 20)
    shard = _cached(tmp_path_factory.mktemp("s") / "p", defn, cache)
    keys = data.draw(st.lists(KEYS[key_format], min_size=1, max_size=12, unique=True))
    offset = 0

    def write(n: int) -> None:
        nonlocal offset
        records = []
        for _ in range(n):
            k = defn.key.serialize(data.draw(st.sampled_from(keys)))
            value = data.draw(st.one_of(st.none(), st.integers(-5, 5)))
            records.append(ChangelogRecord(k, None if value is None else struct.pack(">q", value), offset, offset))
            offset += 1
        shard.apply(records)

    try:
        write(data.draw(st.integers(1, 8)))
        _scan(shard)  # kept from here on
        for _ in range(data.draw(st.integers(1, 4))):
            write(data.draw(st.integers(1, 8)))
            followed_before = cache.followed
            got, position = _scan(shard)
            assert cache.followed == followed_before + 1  # it did follow, not read again
            assert got.equals(_full_scan(shard.base)), (got.to_pylist(), _full_scan(shard.base).to_pylist())
            assert position.get("t", 0) == offset - 1
    finally:
        kv._BISECT_MAX = bisect_max
        shard.close()


def test_doubles_and_other_store_types_are_read_again(tmp_path: Path) -> None:
    defn = StoreDefinition.from_dict({"name": "s", "type": "kv", "topic": "t", "partitions": 1,
                                      "key": {"format": "double"}, "value": {"format": "long"}}, REGISTRY)
    cache = ScanCache(256 << 20)
    shard = _cached(tmp_path / "p", defn, cache)
    shard.apply([ChangelogRecord(struct.pack(">d", 1.5), struct.pack(">q", 1), 0, 0)])
    _scan(shard)
    shard.apply([ChangelogRecord(struct.pack(">d", -0.0), struct.pack(">q", 2), 1, 1)])
    followed = cache.followed
    got, _ = _scan(shard)
    assert cache.followed == followed and got.num_rows == 2
    shard.close()


def test_too_many_writes_since_the_scan_drop_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = ScanCache(256 << 20, max_pending=3)
    shard = _cached(tmp_path / "p", _definition("string"), cache)
    shard.apply([ChangelogRecord(b"a", struct.pack(">q", 1), 0, 0)])
    _scan(shard)
    shard.apply([ChangelogRecord(b"k%d" % i, struct.pack(">q", i), 1 + i, 1) for i in range(4)])
    assert shard.base not in cache._entries
    got, _ = _scan(shard)
    assert got.column(0).to_pylist() == ["a", "k0", "k1", "k2", "k3"]
    shard.close()


@given(st.lists(st.integers(1, 3), min_size=0, max_size=12), st.integers(0, 12), st.data())
def test_the_held_writes_between_two_sequences_are_found_from_either_end(steps, folded, data) -> None:
    """Writes held beside a kept scan (folded ones in history, then pending): those from
    ``since`` to ``upto`` are exactly the run of consecutive held writes between them, and
    none when a write between them is not held (a gap) or either end is not a write's."""
    from federator.store.scan_cache import _Entry, _Write

    writes, seq = [], 0
    for step in steps:  # a step of 3 leaves a gap: a write that was not held
        if step == 3:
            seq += 2
            continue
        writes.append(_Write(seq, seq + 2, [], None, 0))
        seq += 2
    folded = min(folded, len(writes))
    entry = _Entry(0, pa.record_batch({"k": [1]}), 0, history=writes[:folded], pending=writes[folded:])
    since = data.draw(st.integers(0, seq + 2).map(lambda n: n - n % 2))
    upto = data.draw(st.integers(since, seq + 2).map(lambda n: n - n % 2))
    want = None
    if since == upto:
        want = []
    else:
        for i, w in enumerate(writes):
            if w.before == since:
                for j in range(i, len(writes)):
                    if writes[j].after == upto:
                        want = writes[i:j + 1] if all(a.after == b.before for a, b in zip(writes[i:j], writes[i + 1:j + 1])) else None
                        break
                break
    assert entry.writes(since, upto) == want
