"""The leaderboard's order-statistics index: every row of a partition as one entry,
``sortable(score) + ordered(key)``, in a sorted list (sortedcontainers' SortedList: a list of
sorted sublists with a positional index), so that how many rows rank before a given one, and
which rows hold given ranks, each cost O(log n), and so does a write.

Entries compare as bytes: by score (``sortable`` makes byte order the scores' numeric order),
then by key in the order DuckDB sorts the key column (``key_order``). The functions here take
any such sorted list: a shard's whole index, or the windows of several partitions a receiver
got back.
"""

from __future__ import annotations

import contextlib
import itertools
import struct
import threading
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterable

from sortedcontainers import SortedList

_U64 = struct.Struct(">Q")
END = 1 << 64  # one past the largest sortable score
SIGNED_KEYS = ("long", "int")  # big-endian two's complement: byte order puts negatives last


def score_of(entry: bytes) -> int:
    """The sortable score (a uint64) an entry starts with."""
    return _U64.unpack_from(entry)[0]


def key_order(key_format: str) -> Callable[[bytes], bytes]:
    """The key's bytes in the order DuckDB sorts the key column (and back: it is its own
    inverse): signed integers with the sign bit flipped, strings and bytes as they are (UTF-8
    byte order is code point order, and DuckDB compares both bytewise)."""
    if key_format in SIGNED_KEYS:
        return lambda key: bytes((key[0] ^ 0x80,)) + key[1:] if key else key
    return lambda key: key


def entry(score: int, key: bytes) -> bytes:
    return _U64.pack(score) + key


@dataclass(frozen=True)
class Order:
    """A ranking order: by score (``descending`` or not), ties left tied (``tie_key`` None) or
    broken by the key, ``"asc"`` or ``"desc"``."""

    descending: bool = True
    tie_key: str | None = None


def start(entries: SortedList, score: int) -> int:
    """The position of the first entry whose score is ``score`` or more."""
    return entries.bisect_left(_U64.pack(score)) if score < END else len(entries)


def before(entries: SortedList, score: int, key: bytes, order: Order) -> int:
    """How many entries rank strictly before a row with this score and (ordered) key."""
    # only the bounds of the score's group this order reads: a rank runs this once a partition
    if order.tie_key == "asc":
        lo = start(entries, score)
        ahead = len(entries) - start(entries, score + 1) if order.descending else lo
        return ahead + entries.bisect_left(entry(score, key)) - lo
    if order.tie_key == "desc":
        hi = start(entries, score + 1)
        ahead = len(entries) - hi if order.descending else start(entries, score)
        return ahead + hi - entries.bisect_right(entry(score, key))
    return len(entries) - start(entries, score + 1) if order.descending else start(entries, score)


def nth(entries: SortedList, k: int, order: Order) -> int:
    """The position in ``entries`` of the row ``order`` ranks ``k``-th (from 0), ties broken by
    the key (``order.tie_key`` set): where the key's order runs against the score's (score
    DESC, key ASC), a score group reads the other way round."""
    at = len(entries) - 1 - k if order.descending else k
    if (order.tie_key == "asc") == order.descending:
        score = score_of(entries[at])
        at = start(entries, score) + start(entries, score + 1) - 1 - at
    return at


def distinct_better(entries: SortedList, score: int, descending: bool) -> list[int]:
    """The distinct scores better than ``score``, one bisect per score."""
    out: list[int] = []
    if descending:
        i = start(entries, score + 1)
        while i < len(entries):
            out.append(s := score_of(entries[i]))
            i = start(entries, s + 1)
    else:
        i = start(entries, score)
        while i > 0:
            out.append(s := score_of(entries[i - 1]))
            i = start(entries, s)
    return out


def _up(entries: SortedList, at: int, rows: int) -> int:
    """The end of the score group holding the ``rows``-th entry from ``at`` up (``at`` when
    ``rows`` <= 0): at least ``rows`` entries, never a group cut."""
    if rows <= 0 or at >= len(entries):
        return at
    return start(entries, score_of(entries[min(at + rows, len(entries)) - 1]) + 1)


def _down(entries: SortedList, at: int, rows: int) -> int:
    """The start of the score group holding the ``rows``-th entry from ``at`` down."""
    if rows <= 0 or at <= 0:
        return at
    return start(entries, score_of(entries[max(at - rows, 0)]))


def top(entries: SortedList, k: int, descending: bool, distinct: bool = False) -> tuple[int, int]:
    """Positions [lo, hi) of the ``k`` best rows with every row tied with the k-th (or, with
    ``distinct``, every row of the ``k`` best scores)."""
    n = len(entries)
    if not distinct:
        return (_down(entries, n, k), n) if descending else (0, _up(entries, 0, k))
    at = n if descending else 0
    for _ in range(max(k, 0)):
        if descending and at > 0:
            at = start(entries, score_of(entries[at - 1]))
        elif not descending and at < n:
            at = start(entries, score_of(entries[at]) + 1)
    return (at, n) if descending else (0, at)


def around(entries: SortedList, score: int, above: int, below: int, descending: bool) -> tuple[int, int]:
    """Positions [lo, hi) of whole score groups around ``score``: its own group, then at
    least ``above`` rows that rank before it and ``below`` that rank after it."""
    lo, hi = start(entries, score), start(entries, score + 1)
    if descending:
        return _down(entries, lo, below), _up(entries, hi, above)
    return _down(entries, lo, above), _up(entries, hi, below)


LOGGED_BATCHES = 4096  # the batches whose reach an index remembers (``touched_since``)


class ScoreIndex:
    """A shard's index, in memory. Readers take ``lock`` for the few bisects they make: a
    write moves entries between SortedList's sublists, and a read in between could see
    neither place (the shard's sequence lock then discards what it read, but it may raise).

    It also remembers, for its last LOGGED_BATCHES batches, the lowest and highest entry each
    removed or added: so a top-k kept from an earlier offset is known to be the top-k now when
    no write since reached it (``touched_since``). A global store's shard's index passes each
    change on to the index of every partition it is part of (``together``)."""

    def __init__(self, entries: Iterable[bytes] = (), offset: int | None = None) -> None:
        self.entries = SortedList(entries)
        self.lock = threading.Lock()
        self.together: TogetherIndex | None = None  # a global store's index of every partition, fed by this one
        self._floor = -1 if offset is None else offset  # the log holds every change after this offset
        self._log: deque[tuple[int, bytes, bytes]] = deque()  # (the batch's last offset, lowest, highest)

    def __len__(self) -> int:
        return len(self.entries)

    def change(self, removed: list[bytes], added: list[bytes], through: int) -> Callable[[], None]:
        """The change a batch through offset ``through`` makes, to run once the batch is
        written (StoreType.apply)."""
        touched = removed + added

        def run() -> None:
            with self.lock:
                _change(self.entries, removed, added)
                if self.together is not None:
                    self.together.change(removed, added)
                if touched:
                    self._log.append((through, min(touched), max(touched)))
                    if len(self._log) > LOGGED_BATCHES:
                        self._floor = self._log.popleft()[0]
        return run

    def touched_since(self, offset: int) -> tuple[bytes, bytes] | tuple[None, None] | None:
        """The lowest and highest entry removed or added by the batches after ``offset``
        ((None, None): none); None when the index does not remember that far back (it was
        built after it, or forgot)."""
        with self.lock:
            if offset < self._floor:
                return None
            lo = hi = None
            for through, low, high in reversed(self._log):
                if through <= offset:
                    break
                lo = low if lo is None else min(lo, low)
                hi = high if hi is None else max(hi, high)
            return (lo, hi) if lo is not None else (None, None)


class TogetherIndex:
    """A global store's partitions' indexes as one (``together``): a rank over every partition
    is then one bisect, not one a partition. Each part feeds its changes here while it holds its
    own lock, inside the shard's write, so a read that the shards' write sequences find
    undisturbed read this in the same states as them. Locks are taken part first, then this;
    it is made holding every part's."""

    def __init__(self, parts: tuple[ScoreIndex, ...]) -> None:
        self.parts = parts
        self.lock = threading.Lock()
        with contextlib.ExitStack() as held:  # every part at once: one sort of them all, not one a part
            for part in parts:
                held.enter_context(part.lock)
            self.entries = SortedList(itertools.chain.from_iterable(part.entries for part in parts))
            for part in parts:
                part.together = self

    def change(self, removed: list[bytes], added: list[bytes]) -> None:
        with self.lock:
            _change(self.entries, removed, added)


def _change(entries: SortedList, removed: list[bytes], added: list[bytes]) -> None:
    for e in removed:
        entries.remove(e)
    entries.update(added)


_BUILDING = threading.Lock()  # one TogetherIndex made at a time: each part feeds one


def together(parts: list[ScoreIndex]) -> TogetherIndex:
    """The index of these parts as one: made on first use, and again when a part is new (its
    shard opened again or was reset), at the cost of merging every part's entries once."""
    kept = parts[0].together
    if kept is not None and kept.parts == tuple(parts):
        return kept
    with _BUILDING:
        kept = parts[0].together
        if kept is not None and kept.parts == tuple(parts):
            return kept
        return TogetherIndex(tuple(parts))
