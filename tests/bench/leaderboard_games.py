"""Games ending at a steady rate: each raises a random player's total score and writes the new
total, to the leaderboard's changelog (Kafka) or to a Redis sorted set, and logs where it landed
in a ``Replay`` so that every answer read meanwhile can be checked as of its position."""

from __future__ import annotations

import random
import threading
import time
from typing import Any, Callable

from tests.bench.leaderboard_replay import Position, Replay

GAME_POINTS = 50_000  # a game adds 1..GAME_POINTS to the player's total: ranks move by hundreds


class Paced:
    """Calls ``send(n)`` every ``tick`` seconds from a thread of its own, n being the calls due
    to keep ``rate`` a second since the start; ``flush`` after the last."""

    def __init__(self, rate: int, send: Callable[[int], None], flush: Callable[[], None] = lambda: None,
                 tick: float = 0.01) -> None:
        self.rate, self.sent, self._send, self._flush, self._tick = rate, 0, send, flush, tick
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Paced:
        if self.rate:
            self._thread.start()
        return self

    def _run(self) -> None:
        started = time.monotonic()
        while not self._stop.wait(self._tick):
            due = int((time.monotonic() - started) * self.rate) - self.sent
            if due > 0:
                self._send(due)
                self.sent += due

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        if self.rate:
            self._thread.join(10)
        self._flush()


class Scores:
    """The players' current totals as the writers know them, and the next game's new total."""

    def __init__(self, replay: Replay, seed: int) -> None:
        self.players, self.totals = replay.players, list(replay.scores)
        self._rnd = random.Random(seed)
        self._lock = threading.Lock()

    def game(self, player: int | None = None) -> tuple[int, int]:
        """(player index, its new total) for a game that just ended, of ``player`` or a random one."""
        with self._lock:
            i = self._rnd.randrange(len(self.players)) if player is None else player
            self.totals[i] += self._rnd.randint(1, GAME_POINTS)
            return i, self.totals[i]


class KafkaGames:
    """New totals produced to the leaderboard's changelog (the value as the store's format
    serializes it); each record's partition and offset are logged when it is acknowledged."""

    def __init__(self, bootstrap: str, topic: str, serialize: Callable[[int], bytes], scores: Scores,
                 replay: Replay, linger_ms: int = 5) -> None:
        from federator import kafka

        self.topic, self.serialize, self.scores, self.replay = topic, serialize, scores, replay
        self.producer = kafka.producer(bootstrap, **{"linger.ms": linger_ms})

    def end(self, player: int | None = None, acked: Callable[[int, int], None] | None = None) -> int:
        """One game's new total sent; ``acked(partition, offset)`` once the broker has it. The player's index."""
        i, total = self.scores.game(player)

        def done(err: Any, msg: Any) -> None:
            assert err is None, f"a score was not written: {err}"
            self.replay.record(msg.partition(), msg.offset(), i, total)
            if acked is not None:
                acked(msg.partition(), msg.offset())

        self.producer.produce(self.topic, key=self.scores.players[i].encode(), value=self.serialize(total),
                              on_delivery=done)
        return i

    def paced(self, rate: int) -> Paced:
        def send(n: int) -> None:
            for _ in range(n):
                self.end()
            self.producer.poll(0)

        return Paced(rate, send, self.flush)

    def flush(self) -> None:
        assert self.producer.flush(30) == 0, "scores still unacknowledged after 30 s"


def produce_totals(bootstrap: str, topic: str, players: list[str], totals: list[int],
                   serialize: Callable[[int], bytes]) -> Position:
    """Every player's total produced once (the leaderboard before the games); the position of them all."""
    from federator import kafka

    producer = kafka.producer(bootstrap, **{"linger.ms": 50, "batch.num.messages": 10_000,
                                            "queue.buffering.max.messages": 500_000})
    last: Position = {}

    def done(err: Any, msg: Any) -> None:
        assert err is None, f"a score was not written: {err}"
        last[msg.partition()] = max(last.get(msg.partition(), -1), msg.offset())

    for i, (player, total) in enumerate(zip(players, totals)):
        while True:
            try:
                producer.produce(topic, key=player.encode(), value=serialize(total), on_delivery=done)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(120) == 0, "the players' totals still unacknowledged after 120 s"
    return last


class RedisGames:
    """New totals written to the sorted set ``key``: each tick's games in one MULTI with an INCR of
    ``seq_key``, whose value is their position in the log (readers read it in their own MULTI)."""

    def __init__(self, client: Any, key: str, seq_key: str, scores: Scores, replay: Replay) -> None:
        self.client, self.key, self.seq_key, self.scores, self.replay = client, key, seq_key, scores, replay

    def end(self, n: int) -> None:
        games = [self.scores.game() for _ in range(n)]
        pipe = self.client.pipeline(transaction=True)
        for i, total in games:
            pipe.zadd(self.key, {self.scores.players[i]: total})
        pipe.incr(self.seq_key)
        seq = pipe.execute()[-1]
        for i, total in games:
            self.replay.record(0, seq, i, total)

    def paced(self, rate: int) -> Paced:
        return Paced(rate, self.end)
