"""The leaderboard's queries, each answered from a partition's order-statistics index in
O(log n) (plus the rows returned): the best rows of a partition, how many rows rank before
given ones or before the players it holds, the rows ranked near a player, and every score it
holds; and on a global leaderboard, the players' ranks, and the rows ranked around a player,
from every partition at once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Self

from federator.query.queries import Query, decode_value, encode_value


@dataclass(frozen=True)
class TopKQuery(Query):
    """The k best rows of a partition by score, plus any rows tied with the k-th (so a
    tie-breaking ORDER BY at the receiver still sees every candidate); with ``distinct``,
    every row of the k best scores (what ``DENSE_RANK() <= k`` can keep)."""

    type_name: ClassVar[str] = "TopKQuery"
    k: int = 10
    descending: bool = True
    distinct: bool = False


@dataclass(frozen=True)
class RankQuery(Query):
    """How many rows of the partition rank before given places, and the rows of ``players``
    the partition holds, from the same read (so the receiver can tell that the scores it
    counted from are still the players' scores).

    A place is ``scores[i]``, with ``keys[i]`` where ties are broken by the key (``tie_key``
    ``"asc"`` or ``"desc"``). The counts follow the rows, one row per place (columns
    ``__place``, ``__count``; the store's columns null); with ``dense``, the partition's
    distinct scores better than the worst place instead (``__score``, sortable), which the
    receiver merges, as distinct counts do not add up across partitions."""

    type_name: ClassVar[str] = "RankQuery"
    players: tuple[Any, ...] = ()
    scores: tuple[Any, ...] = ()
    keys: tuple[Any, ...] = ()
    descending: bool = True
    tie_key: str | None = None
    dense: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type_name, "players": [encode_value(p) for p in self.players],
                "scores": list(self.scores), "keys": [encode_value(k) for k in self.keys],
                "descending": self.descending, "tie_key": self.tie_key, "dense": self.dense}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RankQuery:
        return cls(tuple(decode_value(p) for p in d.get("players") or ()), tuple(d.get("scores") or ()),
                   tuple(decode_value(k) for k in d.get("keys") or ()), bool(d.get("descending", True)),
                   d.get("tie_key"), bool(d.get("dense", False)))


@dataclass(frozen=True)
class _PlayersRanked(Query):
    """Players' rows, and what ranks them: by score (``descending`` or not), ties left tied
    (RANK), broken by the key (``tie_key`` ``"asc"`` or ``"desc"``: row numbers), or counted
    once (``dense``: DENSE_RANK)."""

    players: tuple[Any, ...] = ()
    descending: bool = True
    tie_key: str | None = None
    dense: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type_name, "players": [encode_value(p) for p in self.players],
                "descending": self.descending, "tie_key": self.tie_key, "dense": self.dense}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Self:
        return cls(tuple(decode_value(p) for p in d.get("players") or ()), bool(d.get("descending", True)),
                   d.get("tie_key"), bool(d.get("dense", False)))


@dataclass(frozen=True)
class PlacesQuery(_PlayersRanked):
    """The rows of ``players`` the partition holds and, from the same read, what RankQuery says
    beside its rows with the players' own scores as the places (``__place``: the row's index
    among the rows returned), and how many rows the partition holds (``__rows``, in the first
    row after the players'). The partition that holds a player answers for itself in one call
    what ranks the player there."""

    type_name: ClassVar[str] = "PlacesQuery"


@dataclass(frozen=True)
class ScoresQuery(Query):
    """Every score of the partition as its index orders them (sortable uint64s, ascending;
    column ``__score``) when it holds at most ``most`` rows; else one null score. The answer
    depends on the partition's state alone: a receiver keeps it while the partition has not
    moved (federator.dispatch.partition_answers) and counts from it what ranks before any
    score, with no call."""

    type_name: ClassVar[str] = "ScoresQuery"
    most: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type_name, "most": self.most}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ScoresQuery:
        return cls(int(d.get("most", 0)))


@dataclass(frozen=True)
class PlayerRanksQuery(_PlayersRanked):
    """The rows of ``players`` with their ranks (column ``__rank``), read from every partition
    of a global leaderboard at once on the node asked (a store type's ``together_handlers``):
    each player's score and how many rows rank before it, in one read."""

    type_name: ClassVar[str] = "PlayerRanksQuery"


@dataclass(frozen=True)
class AroundQuery(Query):
    """The rows ranked near ``score`` (a player's, as the index orders it: a sortable uint64):
    whole score groups, its own and then at
    least ``above`` rows that rank before it and ``below`` that rank after it, each row with
    its index entry (column ``__entry``); then one row (the store's columns null) saying how
    many of the partition's rows rank before the rows returned (``__before``), how many after
    (``__after``), and ``player``'s sortable score in the same read (``__score``, null where
    the partition does not hold it)."""

    type_name: ClassVar[str] = "AroundQuery"
    player: Any = None
    score: Any = None
    above: int = 0
    below: int = 0
    descending: bool = True


@dataclass(frozen=True)
class RanksAroundQuery(Query):
    """The rows ranked from ``above`` places before ``player``'s rank to ``below`` after it,
    with their ranks (column ``__rank``) and the player's (``__anchor_rank``), read from every
    partition of a global leaderboard at once on the node asked (a together handler), so the
    player's score and the rows around it are of one state. No rows where the store does not
    hold the player. Ranked by score (``descending`` or not), ties left tied (RANK) or broken
    by the key (``tie_key`` ``"asc"`` or ``"desc"``: row numbers)."""

    type_name: ClassVar[str] = "RanksAroundQuery"
    player: Any = None
    above: int = 0
    below: int = 0
    descending: bool = True
    tie_key: str | None = None
