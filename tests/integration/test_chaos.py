"""The kill test: a broker, 3 nodes with one standby copy each, a writer upserting keys with
increasing versions, readers carrying the writer's consistency tokens (point reads, COUNT(*),
full scans) and readers allowed stale answers, while random nodes are SIGKILLed and restarted.

The oracle. Every write gives its key a new version, a number no other write uses, so an answer
names the write it comes from. The writer's token, taken together with the versions it had
acknowledged at that moment, covers exactly those writes; a read carrying it must answer, for
each key, a version that was written to that key, no older than the acknowledged one, and no
newer than the latest sent for it when the answer came. Every key exists from the start (no
deletes), so COUNT(*) is the number of keys and a scan has every key once: anything else is a
silent partial answer. Reads with allow_stale need no token; their answers must still be versions
written to that key, and they are counted apart. A 409/503/504 is unavailability: the reader
retries, as a client would; another 5xx or 4xx is an error. A node not killed by the test that
exits is a self-death.

Unavailability: the time a reader waits for a correct answer (its retries included), and per
kill the worst wait among the reads that finished after that kill and before the next.

The default run is short (FEDERATOR_CHAOS_KILLS, default 2 kills, 300 keys); `make chaos` runs
9 kills over 2,000 keys and prints the figures.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import pytest
import urllib3

from federator import kafka
from tests.integration.changelog_util import register
from tests.integration.cluster import Cluster, NodeProcess, wait_for, write_with_token
from tests.threads import Worker, join_all

P = 8
KILLS = int(os.environ.get("FEDERATOR_CHAOS_KILLS", "2"))
KEYS = int(os.environ.get("FEDERATOR_CHAOS_KEYS", "2000" if KILLS > 2 else "300"))
READERS = 3
WRITES_PER_SECOND = 150
ATTEMPT_TIMEOUT_MS = 3000  # one attempt's timeout_ms; a reader retries until GIVE_UP_S
GIVE_UP_S = 60.0
RETRYABLE = {409, 503, 504}  # NOT_UP_TO_BOUND, UNAVAILABLE, TIMEOUT


class Writer:
    """Upserts random keys with increasing versions; its token covers what it has acknowledged."""

    def __init__(self, bootstrap: str, defn, keys: list[str]) -> None:
        self.defn, self.keys = defn, keys
        self.producer = kafka.producer(bootstrap, **{"linger.ms": 5})
        self.lock = threading.Lock()
        self.version = 0
        self.owner: dict[int, str] = {}  # version -> the key it was written to
        self.sent: dict[str, int] = {}  # key -> newest version produced
        self.acked: dict[str, int] = {}  # key -> newest version acknowledged (covered by the token)
        self.position = None
        self.writes = 0
        self.stop = threading.Event()

    def write(self, keys: list[str]) -> None:
        with self.lock:
            batch = {}
            for k in keys:
                self.version += 1
                batch[k] = self.version
                self.owner[self.version] = k
                self.sent[k] = self.version
        position = write_with_token("", self.defn, batch, self.producer)
        with self.lock:
            self.acked.update(batch)
            self.position = position if self.position is None else self.position.merge(position)
            self.writes += len(batch)

    def token(self, key: str | None = None) -> tuple[str, dict[str, int]]:
        """The token and the acknowledged versions it covers (of ``key``, or of every key)."""
        with self.lock:
            return self.position.to_token(), ({key: self.acked[key]} if key is not None else dict(self.acked))

    def newest_sent(self) -> dict[str, int]:
        with self.lock:
            return dict(self.sent)

    def run(self) -> None:
        rnd = random.Random(7)
        batch = 10
        while not self.stop.is_set():
            started = time.monotonic()
            self.write(rnd.sample(self.keys, batch))
            self.stop.wait(max(0.0, batch / WRITES_PER_SECOND - (time.monotonic() - started)))


@dataclass
class Tally:
    attempts: Counter = field(default_factory=Counter)  # kind -> attempts
    reads: Counter = field(default_factory=Counter)  # kind -> logical reads answered
    retried: Counter = field(default_factory=Counter)  # status -> attempts retried
    why: dict = field(default_factory=dict)  # status -> the first few error messages retried
    stale_failures: int = 0  # allow_stale attempts that did not answer
    errors: list[str] = field(default_factory=list)  # 5xx other than 503/504, unexpected 4xx, gave up
    fivexx: int = 0
    wrong: list[str] = field(default_factory=list)
    partial: list[str] = field(default_factory=list)
    waits: list[tuple[float, float, str]] = field(default_factory=list)  # (end, wait, kind) per logical read
    lock: threading.Lock = field(default_factory=threading.Lock)


class Chaos:
    def __init__(self, cluster: Cluster, writer: Writer, keys: list[str]) -> None:
        self.cluster, self.writer, self.keys = cluster, writer, keys
        self.pool = list(cluster.nodes)  # the nodes clients send to: up and ready once since (re)start
        self.pool_lock = threading.Lock()
        self.tally = Tally()
        self.stop = threading.Event()

    def pick(self, rnd: random.Random) -> NodeProcess:
        with self.pool_lock:
            return rnd.choice(self.pool)

    # ---- one logical read: attempts until an answer, checked by the oracle -----------------
    def read(self, rnd: random.Random) -> None:
        kind = rnd.choices(["point", "count", "scan", "stale point", "stale count"], [70, 10, 5, 10, 5])[0]
        stale = kind.startswith("stale")
        key = rnd.choice(self.keys)
        started = time.monotonic()
        while not self.stop.is_set():
            if stale:
                token, acked = None, {}
            else:
                token, acked = self.writer.token(key if kind == "point" else None)
            fields = {"allow_stale": True} if stale else {"consistency_token": token}
            if kind.endswith("point"):
                sql, fields["parameters"] = "SELECT value FROM chaos WHERE key = ?", [key]
            elif kind.endswith("count"):
                sql = "SELECT COUNT(*) FROM chaos"
            else:
                sql = "SELECT key, value FROM chaos"
            node = self.pick(rnd)
            with self.tally.lock:
                self.tally.attempts[kind] += 1
            try:
                status, body = node.sql(sql, timeout=ATTEMPT_TIMEOUT_MS / 1000 + 10, timeout_ms=ATTEMPT_TIMEOUT_MS,
                                        **fields)
            except urllib3.exceptions.HTTPError:  # the node was killed under us: another one
                with self.tally.lock:
                    self.tally.retried["no connection"] += 1
                continue
            if status == 200:
                self.check(kind, key, body["rows"], acked)
                with self.tally.lock:
                    self.tally.reads[kind] += 1
                    self.tally.waits.append((time.monotonic(), time.monotonic() - started, kind))
                return
            with self.tally.lock:
                if stale:
                    self.tally.stale_failures += 1
                if status in RETRYABLE:
                    self.tally.retried[status] += 1
                    if len(self.tally.why.setdefault(status, [])) < 3:
                        self.tally.why[status].append(f"{kind} on {node.node_id}: {body.get('error')}")
                else:
                    self.tally.fivexx += status >= 500
                    self.tally.errors.append(f"{kind} on {node.node_id}: HTTP {status} {body.get('error')}")
                    return
            if time.monotonic() - started > GIVE_UP_S:
                with self.tally.lock:
                    self.tally.errors.append(f"{kind}: no answer in {GIVE_UP_S:.0f} s: HTTP {status} {body.get('error')}")
                return
            time.sleep(0.05)

    def check(self, kind: str, key: str, rows: list, acked: dict[str, int]) -> None:
        sent = self.writer.newest_sent()
        owner = self.writer.owner

        def wrong_version(k: str, v: int) -> str | None:
            if owner.get(v) != k:
                return f"{k}={v}, a version never written to {k}"
            if v < acked.get(k, 0):
                return f"{k}={v}, older than the token's {acked[k]}"
            if v > sent[k]:
                return f"{k}={v}, newer than any sent ({sent[k]})"
            return None

        problems, partial = [], None
        if kind.endswith("point"):
            if len(rows) != 1:
                partial = f"{kind} {key}: {len(rows)} rows"
            else:
                problems.append(wrong_version(key, rows[0][0]))
        elif kind.endswith("count"):
            if rows != [[len(self.keys)]]:
                partial = f"{kind}: {rows} rows counted, {len(self.keys)} keys written"
        else:
            got = Counter(k for k, _ in rows)
            if len(rows) != len(self.keys) or set(got) != set(self.keys):
                partial = f"{kind}: {len(rows)} rows, {len(got)} distinct keys of {len(self.keys)}"
            problems.extend(wrong_version(k, v) for k, v in rows)
        problems = [p for p in problems if p]
        with self.tally.lock:
            if partial:
                self.tally.partial.append(partial)
            if problems:
                self.tally.wrong.append(f"{kind}: {problems[:3]}")

    def reader(self, seed: int) -> None:
        rnd = random.Random(seed)
        while not self.stop.is_set():
            self.read(rnd)

    def answered(self) -> int:
        with self.tally.lock:
            return sum(self.tally.reads.values())


def _owners_are(cluster: Cluster, nodes: list[NodeProcess]) -> bool:
    ids = {n.node_id for n in nodes}
    owners = cluster.active_map("chaos", nodes[0])
    return sorted(owners) == list(range(P)) and set(owners.values()) <= ids


@pytest.mark.apache_kafka(long=True)
def test_kill_and_restart_nodes_under_reads_and_writes(broker, app_id, tmp_path) -> None:
    defn = register(broker, app_id, {"name": "chaos", "type": "kv", "partitions": P,
                                     "key": {"format": "string"}, "value": {"format": "long"}})
    keys = [f"key-{i:05d}" for i in range(KEYS)]
    writer = Writer(broker.bootstrap_servers, defn, keys)
    for i in range(0, KEYS, 500):
        writer.write(keys[i:i + 500])
    cluster = Cluster(broker.bootstrap_servers, app_id, tmp_path / "nodes", size=3, standby_replicas=1).start()
    chaos = Chaos(cluster, writer, keys)
    threads = [Worker(writer.run, name="writer")]
    threads += [Worker(chaos.reader, i, name=f"reader{i}") for i in range(READERS)]

    def reads_flow(what: str) -> None:
        """Wait for 50 more answered reads; a writer or reader that failed fails the test now."""
        seen = chaos.answered()
        wait_for(lambda: chaos.answered() >= seen + 50 or not all(t.is_alive() for t in threads), 30, what)
        if not all(t.is_alive() for t in threads):
            join_all([t for t in threads if not t.is_alive()], 0)
            raise AssertionError(f"{[t.name for t in threads if not t.is_alive()]} stopped")

    kills: list[tuple[float, str]] = []
    takeovers: list[float] = []  # per kill: seconds until the survivors own every partition
    killed: set[str] = set()  # nodes the test has killed and not restarted yet
    self_deaths: list[str] = []
    rnd = random.Random(11)
    began = time.monotonic()
    try:
        cluster.wait_settled("chaos", P, timeout=60)
        for t in threads:
            t.start()
        for _ in range(KILLS):
            # steady first: every node up, owners and standby copies in place, reads answered
            cluster.wait_settled("chaos", P, timeout=60)
            reads_flow("reads to flow on the settled cluster")
            victim = rnd.choice(cluster.nodes)
            with chaos.pool_lock:
                chaos.pool.remove(victim)
            killed.add(victim.node_id)
            kills.append((time.monotonic(), victim.node_id))
            victim.stop(signal.SIGKILL)
            survivors = [n for n in cluster.nodes if n is not victim]
            wait_for(lambda: _owners_are(cluster, survivors), 30, f"the survivors to take over from {victim.node_id}",
                     interval=0.05)
            # until then a read that needs the active owner of the victim's partitions has none
            takeovers.append(time.monotonic() - kills[-1][0])
            victim.start()
            wait_for(victim.ready, 60, f"{victim.node_id} to be ready after its restart")
            killed.discard(victim.node_id)
            with chaos.pool_lock:
                chaos.pool.append(victim)
            self_deaths += [n.node_id for n in cluster.nodes if n.proc.poll() is not None and n.node_id not in killed]
            assert not self_deaths, f"nodes died that the test did not kill: {self_deaths}"
        cluster.wait_settled("chaos", P, timeout=60)
        reads_flow("reads to flow after the last restart")
    finally:
        writer.stop.set()
        chaos.stop.set()
        join_all(threads, GIVE_UP_S + 15)  # what failed in a writer or reader fails the test
    ran = time.monotonic() - began
    self_deaths += [n.node_id for n in cluster.nodes if n.proc.poll() is not None]

    # the end state: with no more writes, a scan with the final token reads exactly the last versions
    token, acked = writer.token()
    try:
        status, body = cluster.nodes[0].sql("SELECT key, value FROM chaos", consistency_token=token)
    finally:
        cluster.stop()
    assert status == 200, body
    assert dict(body["rows"]) == acked

    t = chaos.tally
    per_kill = []
    for i, (at, node) in enumerate(kills):
        until = kills[i + 1][0] if i + 1 < len(kills) else float("inf")
        worst = max((w for end, w, kind in t.waits if at <= end < until and not kind.startswith("stale")), default=0.0)
        worst_stale = max((w for end, w, kind in t.waits if at <= end < until and kind.startswith("stale")), default=0.0)
        per_kill.append((node, worst, worst_stale))
    before = max((w for end, w, _ in t.waits if not kills or end < kills[0][0]), default=0.0)
    print(f"\nchaos: {ran:.0f} s, {len(kills)} kills, {writer.writes} writes over {KEYS} keys, "
          f"{sum(t.reads.values())} reads answered ({dict(t.reads)}), {sum(t.attempts.values())} attempts, "
          f"retried: {dict(t.retried)}")
    print("chaos: worst wait for an answer before the first kill: %.2f s" % before)
    for status, messages in t.why.items():
        print(f"chaos: retried {status}, for example: {messages}")
    for i, ((node, worst, worst_stale), took) in enumerate(zip(per_kill, takeovers), 1):
        print(f"chaos: kill {i} ({node}): worst unavailability {worst:.2f} s with a token, {worst_stale:.2f} s allow_stale; "
              f"the survivors owned its partitions after {took:.2f} s")
    print(f"chaos: worst unavailability per kill {max((w for _, w, _ in per_kill), default=0):.2f} s; "
          f"stale failures {t.stale_failures}; 5xx {t.fivexx}; wrong answers {len(t.wrong)}; "
          f"silent partial answers {len(t.partial)}; other errors {len(t.errors)}; self-deaths {len(self_deaths)}")

    assert not t.wrong, t.wrong[:5]
    assert not t.partial, t.partial[:5]
    assert t.fivexx == 0 and not t.errors, t.errors[:5]
    assert not self_deaths, self_deaths
    assert len(kills) == KILLS and all(t.reads[k] > 0 for k in ("point", "count", "scan", "stale point")), t.reads
