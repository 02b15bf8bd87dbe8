"""Checking leaderboard answers while scores change: the scores as of the position an answer names.

Every write is logged with where it landed: a Kafka record with its partition and offset, a Redis
transaction with the sequence number it took (one "partition", 0). An answer that carries the
position it reflects (Federator's consistency token; for Redis, the sequence read in the same
transaction) is checked against the scores as of that position: the scores every node showed
before the load (the base), with every logged write at or below the position applied.

``check_all`` takes the answers in the order of their positions' sums, so between two answers
the state moves a few writes forward or back; a count of better scores is a bisection of a
sorted list, so each check costs O(log n) however many players there are.
"""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

from sortedcontainers import SortedList

Position = dict[int, int]  # partition -> offset (the last write applied)
Check = Callable[["Replay"], "str | None"]


class Replay:
    """The scores as of a position: a base state and a log of writes past it."""

    def __init__(self, players: Sequence[str], scores: Sequence[int], base: Position) -> None:
        self.players = list(players)
        self.index = {p: i for i, p in enumerate(self.players)}
        self.scores = list(scores)
        self.ranked = SortedList(self.scores)
        self.base = dict(base)
        self.position = dict(base)  # what the state is as of
        self._log: dict[int, list[list[int]]] = {p: [] for p in base}  # [offset, player, new score, old score]
        self._applied = dict.fromkeys(base, 0)  # partition -> how many of its logged writes the state holds
        self._pending: list[tuple[int, int, int, int]] = []

    def record(self, partition: int, offset: int, player: int, score: int) -> None:
        """A write acknowledged at ``offset`` of ``partition`` (safe from a delivery callback's thread)."""
        self._pending.append((partition, offset, player, score))

    def settle(self) -> None:
        """The writes recorded so far into the log, in offset order. Call it with no write in
        flight: every write acknowledged later then lands above every logged one."""
        pending, self._pending = self._pending, []
        for partition, offset, player, score in sorted(pending, key=lambda w: (w[0], w[1])):
            log = self._log[partition]
            assert not log or offset >= log[-1][0], f"partition {partition}: offset {offset} logged after {log[-1][0]}"
            log.append([offset, player, score, 0])

    def last(self) -> Position:
        """Each partition's last logged offset: the position of every write so far."""
        return {p: log[-1][0] if log else self.base[p] for p, log in self._log.items()}

    def move_to(self, position: Position) -> str | None:
        """The state moved to ``position``; what is wrong with the position, if anything."""
        if set(position) != set(self.base):
            return f"the answer's position names partitions {sorted(position)}; the store has {sorted(self.base)}"
        last = self.last()
        for p, target in position.items():
            if target < self.base[p]:
                return f"partition {p} at offset {target}: older than what every node showed before the load ({self.base[p]})"
            if target > last[p]:
                return f"partition {p} at offset {target}: past the last write ({last[p]})"
            log, n = self._log[p], self._applied[p]
            while n < len(log) and log[n][0] <= target:
                log[n][3] = self.scores[log[n][1]]
                self._set(log[n][1], log[n][2])
                n += 1
            while n > 0 and log[n - 1][0] > target:
                n -= 1
                self._set(log[n][1], log[n][3])
            self._applied[p] = n
        self.position = dict(position)
        return None

    def _set(self, player: int, score: int) -> None:
        self.ranked.remove(self.scores[player])
        self.ranked.add(score)
        self.scores[player] = score

    def history(self, player: str, last: int = 3) -> str:
        """The player's last logged writes and the state's offset in their partition, for a message."""
        i = self.index.get(player)
        writes = [(p, w[0], w[2]) for p, log in self._log.items() for w in log if w[1] == i][-last:]
        if not writes:
            return f"{player}: no write since the base"
        return (f"{player}'s last writes: " + ", ".join(f"{s} at offset {o}" for _, o, s in writes)
                + f" of partition {writes[0][0]}, checked as of offset {self.position[writes[0][0]]}")

    def score(self, player: str) -> int | None:
        i = self.index.get(player)
        return None if i is None else self.scores[i]

    def better(self, score: float) -> int:
        """How many players have a higher score."""
        return len(self.ranked) - self.ranked.bisect_right(score)

    def ties(self, score: float) -> int:
        return self.ranked.bisect_right(score) - self.ranked.bisect_left(score)

    def top(self, k: int) -> list[int]:
        """The k best scores, best first."""
        return list(reversed(self.ranked[-k:])) if k else []


def check_all(replay: Replay, answers: Iterable[tuple[Position, Check]]) -> list[str]:
    """What is wrong with each answer that is wrong, each checked as of its position."""
    wrong = []
    for position, check in sorted(answers, key=lambda a: sum(a[0].values())):
        why = replay.move_to(position) or check(replay)
        if why:
            wrong.append(why)
    return wrong


def top_wrong(rows: list[list], k: int) -> Check:
    """A top-k answer, [[player, score], ...]: the k best scores, best first (ties at the cut in
    any order), each the score its player has."""
    def check(replay: Replay) -> str | None:
        want = replay.top(k)
        if [row[1] for row in rows] != want:
            return f"top-{k} scores {[row[1] for row in rows]}, as of the position {want}"
        if len({row[0] for row in rows}) != len(rows):
            return f"top-{k} names a player twice: {rows}"
        for player, score in rows:
            if replay.score(player) != score:
                return f"top-{k}: {player} with {score}, as of the position {replay.score(player)} ({replay.history(player)})"
        return None
    return check


def rank_wrong(rows: list[list]) -> Check:
    """A RANK() answer, [[player, score, rank]]: the player's score, and 1 + the number of better scores."""
    def check(replay: Replay) -> str | None:
        if len(rows) != 1:
            return f"rank: {len(rows)} rows, one expected: {rows[:3]}"
        (player, score, rank), = rows
        if replay.score(player) != score:
            return f"rank: {player} with {score}, as of the position {replay.score(player)} ({replay.history(player)})"
        if rank != replay.better(score) + 1:
            return f"rank: {player} ranked {rank}, as of the position {replay.better(score) + 1}"
        return None
    return check


def zrevrank_wrong(player: str, rank0: int | None, score: float | None) -> Check:
    """ZREVRANK + ZSCORE read together: the player's score, and a 0-based rank among the players with
    that score (Redis orders ties by member, RANK() gives them one rank)."""
    def check(replay: Replay) -> str | None:
        want = replay.score(player)
        if rank0 is None or score is None or int(score) != want:
            return f"ZSCORE {player}: {score}, as of the sequence {want}"
        better = replay.better(want)
        if not better <= rank0 < better + replay.ties(want):
            return f"ZREVRANK {player}: {rank0}, as of the sequence {better} (with {replay.ties(want)} ties)"
        return None
    return check
