"""Positions, consistency tokens and position bounds (KIP-796)."""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from federator.query import Position, PositionBound

FAST = settings(max_examples=100, deadline=None)

positions = st.dictionaries(
    st.text(alphabet="abcdefgh-._", min_size=1, max_size=8),
    st.dictionaries(st.integers(0, 50), st.integers(0, 2**62), max_size=4),
    max_size=4,
).map(Position)


# ---- Position -----------------------------------------------------------------------------------


def test_get_and_of() -> None:
    p = Position.of("t", 3, 42)
    assert p.get("t", 3) == 42
    assert p.get("t", 2) is None
    assert p.get("u", 3) is None
    assert list(p) == [("t", 3, 42)]
    assert not p.is_empty()
    assert Position().is_empty()
    assert Position({"t": {}}).is_empty()


def test_merge_takes_max_per_partition() -> None:
    a = Position({"t": {0: 5, 1: 10}, "u": {0: 1}})
    b = Position({"t": {0: 7, 1: 3, 2: 0}, "v": {4: 9}})
    m = a.merge(b)
    assert m == Position({"t": {0: 7, 1: 10, 2: 0}, "u": {0: 1}, "v": {4: 9}})
    # neither input changes
    assert a == Position({"t": {0: 5, 1: 10}, "u": {0: 1}})
    assert b == Position({"t": {0: 7, 1: 3, 2: 0}, "v": {4: 9}})


@FAST
@given(positions, positions)
def test_merge_properties(a: Position, b: Position) -> None:
    m = a.merge(b)
    assert m == b.merge(a)
    assert m.merge(m) == m
    assert m.merge(a) == m
    keys = {(t, p) for t, p, _ in a} | {(t, p) for t, p, _ in b}
    assert {(t, p) for t, p, _ in m} == keys
    for t, p in keys:
        assert m.get(t, p) == max(x for x in (a.get(t, p), b.get(t, p)) if x is not None)


def test_with_offset_sets_one_partition_and_copies() -> None:
    a = Position({"t": {0: 5, 1: 10}})
    b = a.with_offset("t", 1, 3)  # backwards is allowed
    c = b.with_offset("u", 0, 8)
    assert b == Position({"t": {0: 5, 1: 3}})
    assert c == Position({"t": {0: 5, 1: 3}, "u": {0: 8}})
    assert a == Position({"t": {0: 5, 1: 10}})
    assert b.get("u", 0) is None


def test_equality_ignores_empty_topics_and_key_types() -> None:
    assert Position({"t": {"1": "5"}}) == Position({"t": {1: 5}})
    assert Position({"t": {}, "u": {0: 1}}) == Position({"u": {0: 1}})
    assert Position({"t": {0: 1}}) != Position({"t": {0: 2}})
    assert Position({"t": {0: 1}}) != Position({"t": {1: 1}})
    assert Position() != {}


def test_to_dict_uses_string_partitions() -> None:
    p = Position({"b": {10: 1, 2: 3}, "a": {0: 0}})
    assert p.to_dict() == {"a": {"0": 0}, "b": {"2": 3, "10": 1}}
    assert Position.from_dict(p.to_dict()) == p


@FAST
@given(positions)
def test_token_round_trip(p: Position) -> None:
    token = p.to_token()
    assert isinstance(token, str)
    assert "=" not in token and "+" not in token and "/" not in token  # url-safe, unpadded
    assert Position.from_token(token) == p
    assert Position.from_dict(json.loads(json.dumps(p.to_dict()))) == p


def test_token_is_base64_json() -> None:
    token = Position.of("t", 1, 7).to_token()
    raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    assert json.loads(raw) == {"t": {"1": 7}}


@pytest.mark.parametrize(
    "token",
    [
        "not a token!",
        "e30",  # "{}" is fine (checked below); mangle it:
        "",
        "W10",  # "[]"
        "WzFd",  # "[1]"
        "bnVsbA",  # "null"
        "InRleHQi",  # '"text"'
        base64.urlsafe_b64encode(b'{"t": 5}').decode(),
        base64.urlsafe_b64encode(b'{"t": {"x": 1}}').decode(),
        base64.urlsafe_b64encode(b'{"t": {"0": "five"}}').decode(),
        base64.urlsafe_b64encode(b"\xff\xfe\xfd").decode(),
        "a",
    ],
)
def test_bad_token_raises_value_error_with_help(token: str) -> None:
    if token == "e30":
        assert Position.from_token(token) == Position()
        return
    with pytest.raises(ValueError) as e:
        Position.from_token(token)
    msg = str(e.value)
    assert "consistency token" in msg
    assert "pass back the token of a response" in msg


def test_bad_token_message_is_truncated() -> None:
    token = "!" * 500
    with pytest.raises(ValueError) as e:
        Position.from_token(token)
    assert len(str(e.value)) < 200


# ---- PositionBound --------------------------------------------------------------------------------


def test_unbounded_is_always_satisfied() -> None:
    b = PositionBound.unbounded()
    assert b.is_unbounded
    assert b.is_satisfied_by(Position(), "t", 0)
    assert b.is_satisfied_by(Position.of("t", 0, 5), "t", 0)
    assert b.to_dict() is None
    assert PositionBound.from_dict(None) == b


@pytest.mark.parametrize(("seen", "ok"), [(None, False), (4, False), (5, True), (6, True)])
def test_bound_for_this_partition(seen: int | None, ok: bool) -> None:
    bound = PositionBound.at(Position.of("t", 2, 5))
    have = Position() if seen is None else Position.of("t", 2, seen)
    assert bound.is_satisfied_by(have, "t", 2) is ok


def test_only_this_partitions_entry_counts() -> None:
    bound = PositionBound.at(Position({"t": {0: 100, 1: 5}}))
    # partition 1 is at 5; partition 0 being far behind does not matter for partition 1
    assert bound.is_satisfied_by(Position({"t": {1: 5, 0: 0}}), "t", 1)
    assert not bound.is_satisfied_by(Position({"t": {1: 5, 0: 0}}), "t", 0)
    # a seen entry for another partition does not satisfy this one
    assert not bound.is_satisfied_by(Position({"t": {0: 1000}}), "t", 1)


def test_bound_without_entry_for_this_partition_is_satisfied() -> None:
    bound = PositionBound.at(Position({"t": {0: 100}}))
    assert bound.is_satisfied_by(Position(), "t", 3)


def test_other_topics_in_the_bound_are_ignored() -> None:
    bound = PositionBound.at(Position({"other-store": {0: 10**9}, "t": {0: 3}}))
    assert bound.is_satisfied_by(Position.of("t", 0, 3), "t", 0)
    assert not bound.is_satisfied_by(Position.of("t", 0, 2), "t", 0)
    assert PositionBound.at(Position({"other-store": {0: 10**9}})).is_satisfied_by(Position(), "t", 0)
    # the seen position's other topics don't help either
    assert not bound.is_satisfied_by(Position({"other-store": {0: 10**9}}), "t", 0)


def test_bound_dict_round_trip() -> None:
    bound = PositionBound.at(Position({"t": {0: 3, 7: 9}}))
    assert not bound.is_unbounded
    again = PositionBound.from_dict(json.loads(json.dumps(bound.to_dict())))
    assert again == bound
    assert again.position.get("t", 7) == 9


def test_merged_positions_are_merged_once_for_the_same_states() -> None:
    from federator.query.position import MergedPositions

    a, b = Position.of("t", 0, 4), Position.of("t", 1, 7)
    merged = MergedPositions()
    first = merged.of([a, b])
    assert first.to_dict() == {"t": {"0": 4, "1": 7}}
    assert merged.of([a, b]) is first  # the same states: the merge (and its token) made once
    moved = merged.of([a, Position.of("t", 1, 8)])
    assert moved is not first and moved.to_dict() == {"t": {"0": 4, "1": 8}}
    assert merged.of([Position.of("t", 0, 4), Position.of("t", 1, 8)]) is not moved  # equal is not the same
    assert merged.of([]).is_empty()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["t", "u"]), st.integers(0, 3), st.integers(-1, 50)), min_size=1, max_size=6),
       st.lists(st.tuples(st.integers(0, 5), st.integers(-1, 50)), max_size=8))
def test_merged_positions_moved_one_at_a_time_equal_a_fresh_merge(start, moves) -> None:
    from federator.query.position import MergedPositions

    positions = [Position.of(t, p, o) for t, p, o in start]
    merged = MergedPositions()
    assert merged.of(positions) == Position().merge_all(positions)
    for i, offset in moves:  # one position replaced by its partition's at another offset
        i %= len(positions)
        (t, p, _), = list(positions[i])
        positions = positions[:i] + [Position.of(t, p, offset)] + positions[i + 1:]
        assert merged.of(positions) == Position().merge_all(positions)
