"""Positions (changelog offsets applied) and position bounds, as in KIP-796."""

from __future__ import annotations

import base64
import json
import operator
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Mapping


_COMPACT = json.JSONEncoder(separators=(",", ":"))  # made once: json.dumps makes one a call


class Position:
    """topic -> partition -> offset of the last changelog record applied."""

    __slots__ = ("_offsets", "_token")  # never changed after construction: copies are made instead

    def __init__(self, offsets: Mapping[str, Mapping[int, int]] | None = None):
        self._token: str | None = None
        self._offsets: dict[str, dict[int, int]] = {
            t: {int(p): int(o) for p, o in parts.items()} for t, parts in offsets.items()
        } if offsets else {}  # most are made empty, to be merged into

    @classmethod
    def of(cls, topic: str, partition: int, offset: int) -> Position:
        return cls({topic: {partition: offset}})

    def get(self, topic: str, partition: int) -> int | None:
        return self._offsets.get(topic, {}).get(partition)

    def with_offset(self, topic: str, partition: int, offset: int) -> Position:
        """A copy with this partition's offset set (moved forward or back)."""
        copy = self._copy()
        copy._offsets.setdefault(topic, {})[partition] = offset
        return copy

    def _copy(self) -> Position:
        """A copy whose offsets may be changed; they are ints already, which __init__ would
        convert again (a statement merges one position a partition read)."""
        copy = Position.__new__(Position)
        copy._token = None
        copy._offsets = {t: dict(parts) for t, parts in self._offsets.items()}
        return copy

    def merge(self, other: Position) -> Position:
        """Per partition, the larger offset of the two."""
        if not self._offsets:  # the first a statement merges into its empty start
            return other
        return self.merge_all([other])

    def merge_all(self, others: Iterable[Position]) -> Position:
        """Per partition, the largest offset of this one and ``others``, in one copy (a
        statement's answer merges one position a partition read); one of them as it is when
        the others add nothing, so its token is made once."""
        others = [o for o in others if not o.is_empty()]
        if not others:
            return self
        if len(others) == 1 and self.is_empty():
            return others[0]
        merged = self._copy()
        for other in others:
            for topic, parts in other._offsets.items():
                mine = merged._offsets.setdefault(topic, {})
                for p, o in parts.items():
                    if o > mine.get(p, -1):
                        mine[p] = o
        return merged

    def topics(self) -> list[str]:
        return list(self._offsets)

    def partitions(self, topic: str) -> dict[int, int]:
        return dict(self._offsets.get(topic, {}))

    def __iter__(self) -> Iterator[tuple[str, int, int]]:
        for t, parts in self._offsets.items():
            for p, o in parts.items():
                yield t, p, o

    def is_empty(self) -> bool:
        return not any(self._offsets.values())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Position) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        return f"Position({self.to_dict()})"

    def to_dict(self) -> dict[str, dict[str, int]]:
        return {t: {str(p): o for p, o in sorted(parts.items())} for t, parts in sorted(self._offsets.items()) if parts}

    @classmethod
    def from_dict(cls, d: Mapping[str, Mapping[str | int, int]]) -> Position:
        return cls({t: {int(p): int(o) for p, o in parts.items()} for t, parts in d.items()})

    def to_token(self) -> str:
        """The consistency token clients pass around: url-safe base64 of compact JSON."""
        if self._token is None:  # a shard's position answers many queries before it moves
            raw = _COMPACT.encode(self.to_dict()).encode()
            self._token = base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
        return self._token

    @classmethod
    def from_token(cls, token: str) -> Position:
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
            return cls.from_dict(json.loads(raw))
        except (ValueError, TypeError, AttributeError) as e:
            raise ValueError(
                f"consistency token {token[:40]!r} is not one Federator issued; pass back the token of a response"
            ) from e


class MergedPositions:
    """The merge of the Positions last given, given again for the very same ones (a Position
    never changes, so identity is enough): a statement read again at the same states merges
    them and writes their token once. When each names one partition of its own (a global
    store's partitions read together) and one of them moved, the last merge is copied with
    that partition's offset, not made again from them all."""

    __slots__ = ("_memo",)

    def __init__(self) -> None:
        # (the positions, their merge, whether each names one partition no other names); one
        # tuple, swapped whole: threads see parts that belong together
        self._memo: tuple[tuple[Position, ...], Position, bool] = ((), Position(), False)

    def of(self, positions: list[Position]) -> Position:
        last, merged, apart = self._memo
        if len(last) == len(positions):
            if all(map(operator.is_, last, positions)):  # compared in C: most reads find nothing moved
                return merged
            moved = [(was, now) for was, now in zip(last, positions) if was is not now]
            if apart and len(moved) == 1:
                was, now = _only_entry(moved[0][0]), _only_entry(moved[0][1])
                if was is not None and now is not None and was[:2] == now[:2]:  # the same partition, moved
                    merged = merged.with_offset(*now)
                    self._memo = (tuple(positions), merged, apart)
                    return merged
        merged = Position().merge_all(positions)
        entries = [_only_entry(p) for p in positions]
        apart = None not in entries and len({e[:2] for e in entries}) == len(entries)  # type: ignore[index]
        self._memo = (tuple(positions), merged, apart)
        return merged


def _only_entry(position: Position) -> tuple[str, int, int] | None:
    """(topic, partition, offset) of a position that names one partition, else None."""
    entries = list(position)
    return entries[0] if len(entries) == 1 else None


@dataclass(frozen=True)
class PositionBound:
    """Unbounded, or 'at least at this Position'."""

    position: Position | None = field(default=None)

    @classmethod
    def unbounded(cls) -> PositionBound:
        return cls(None)

    @classmethod
    def at(cls, position: Position) -> PositionBound:
        return cls(position)

    @property
    def is_unbounded(self) -> bool:
        return self.position is None

    def is_satisfied_by(self, seen: Position, topic: str, partition: int) -> bool:
        """Has a shard of ``topic``/``partition`` that has applied ``seen`` caught up with the bound?

        As in Kafka Streams' StoreQueryUtils.isPermitted, only the bound's entry for this
        partition counts; entries for other topics belong to other stores and are ignored
        so that one token can span every store a client reads.
        """
        if self.position is None:
            return True
        wanted = self.position.get(topic, partition)
        if wanted is None:
            return True
        have = seen.get(topic, partition)
        return have is not None and have >= wanted

    def to_dict(self) -> dict | None:
        return None if self.position is None else self.position.to_dict()

    @classmethod
    def from_dict(cls, d: Mapping | None) -> PositionBound:
        return cls(None if d is None else Position.from_dict(d))
