"""The leaderboard's queries: top k of a partition, how many scores beat given ones, and a
partition's whole index."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from federator.query.queries import Query


@dataclass(frozen=True)
class TopKQuery(Query):
    """The k best rows of a partition by score, plus any rows tied with the k-th (so a
    tie-breaking ORDER BY at the receiver still sees every candidate)."""

    type_name: ClassVar[str] = "TopKQuery"
    k: int = 10
    descending: bool = True


@dataclass(frozen=True)
class RankQuery(Query):
    """For each score, how many rows of the partition have a strictly better one.

    A player's rank is 1 + the sum over partitions. Only the partition that holds a
    player knows its score, so the receiver looks the score up first (a KeyQuery)."""

    type_name: ClassVar[str] = "RankQuery"
    scores: tuple[Any, ...] = ()
    descending: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type_name, "scores": list(self.scores), "descending": self.descending}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RankQuery:
        return cls(tuple(d.get("scores") or ()), bool(d.get("descending", True)))


@dataclass(frozen=True)
class ScoreIndexQuery(Query):
    """Every row of the partition in its index's order (score ascending), with each score's
    sortable form as the uint64 column ``__sortable``; no rows when there are more than
    ``max_rows`` (the schema's metadata then says how many, as ``too_many``).

    The answer depends on the partition's state alone, so a receiver keeps it while the
    partition does not move, and ranks any player from it without asking again."""

    type_name: ClassVar[str] = "ScoreIndexQuery"
    max_rows: int = 50_000
