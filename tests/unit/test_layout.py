"""Changelog key layouts: a whole column of keys at once (what writers such as the Spark sink
use) is laid out byte for byte as one key at a time (what the stores split)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from federator.store.layout import (
    SUFFIX_LEN,
    LayoutError,
    changelog_keys,
    plain_key,
    session_key,
    split_session_key,
    split_window_key,
    window_key,
)

TIMES = st.integers(min_value=0, max_value=(1 << 63) - 1)
FAST = settings(max_examples=100, database=None, deadline=None)


@FAST
@given(st.lists(st.tuples(st.binary(max_size=20), TIMES), max_size=50), st.booleans())
def test_window_keys_of_a_column(rows, fixed_width):
    keys = pa.array([k for k, _ in rows], pa.binary())
    if fixed_width:  # fixed-width key formats (long, int, double) come as fixed-size binary
        keys = pa.array([s.to_bytes(8, "big") for _, s in rows], pa.binary(8))
    starts = pa.array([s for _, s in rows], pa.int64())
    got = changelog_keys("window", keys, starts).to_pylist()
    assert got == [window_key(k, s) for k, s in zip(keys.to_pylist(), starts.to_pylist())]
    assert [split_window_key(g) for g in got] == [(k, s, 0) for k, s in zip(keys.to_pylist(), starts.to_pylist())]
    assert [plain_key("window", g) for g in got] == keys.to_pylist()


@FAST
@given(st.lists(st.tuples(st.binary(max_size=20), TIMES, TIMES), max_size=50))
def test_session_keys_of_a_column(rows):
    keys = pa.array([k for k, _, _ in rows], pa.binary())
    starts, ends = pa.array([s for _, s, _ in rows], pa.int64()), pa.array([e for *_, e in rows], pa.int64())
    got = changelog_keys("session", keys, starts, ends).to_pylist()
    assert got == [session_key(k, s, e) for k, s, e in rows]
    assert [split_session_key(g) for g in got] == rows
    assert [plain_key("session", g) for g in got] == [k for k, _, _ in rows]


def test_sliced_columns_and_kv():
    keys = pa.array([b"zz", b"a", b"bc"]).slice(1)
    starts = pa.array([9, 60_000, 0], pa.int64()).slice(1)
    assert changelog_keys("window", keys, starts).to_pylist() == [window_key(b"a", 60_000), window_key(b"bc", 0)]
    assert changelog_keys("kv", keys) is keys  # a kv changelog key is the plain key
    assert plain_key("kv", b"abc") == b"abc"
    assert SUFFIX_LEN == {"kv": 0, "window": 12, "session": 16}


def test_unknown_layouts_and_missing_times_are_errors():
    keys = pa.array([b"a"])
    with pytest.raises(LayoutError, match="not one of kv, window, session"):
        changelog_keys("leaderboard", keys)
    with pytest.raises(LayoutError, match="not one of"):
        plain_key("tree", b"abc")
    with pytest.raises(LayoutError, match="window start times"):
        changelog_keys("window", keys)
    with pytest.raises(LayoutError, match="start and end"):
        changelog_keys("session", keys, pa.array([1], pa.int64()))
