"""Writing a SQL answer's JSON body, timed in process: the node's writer (orjson, in C) beside
the same path with the json module's encoder, its baseline, over the same batches.

Answers: ROWS rows of the column types a dashboard reads most (text, integers, doubles,
timestamps, booleans, a nullable text column), in batches of BATCH rows, written as JSON and
NDJSON; and a one-row answer as a rank or a point read gives it (Python values, no Arrow).
Every body written is parsed and compared with the other writer's, value for value. Nothing
is asserted on timings. About 30 seconds.

    .venv/bin/python -m pytest tests/bench/test_bench_json_answers.py -s
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import random
import time
from typing import Callable, Iterator

import pyarrow as pa
from federator.http import formats
from tests.bench.conftest import Report, progress

ROWS = 100_000
BATCH = 8_192
RUNS = 5  # best of


def _answer() -> tuple[pa.Schema, list[pa.RecordBatch]]:
    rnd = random.Random(7)
    start = dt.datetime(2026, 1, 1)
    table = pa.table({
        "player": [f"player-{i:06d}" for i in range(ROWS)],
        "games": pa.array([rnd.randrange(1_000) for _ in range(ROWS)], pa.int64()),
        "total_score": pa.array([rnd.random() * 1e6 for _ in range(ROWS)], pa.float64()),
        "last_played": pa.array([start + dt.timedelta(seconds=rnd.randrange(10**7)) for _ in range(ROWS)],
                                pa.timestamp("ms")),
        "active": [rnd.random() < 0.5 for _ in range(ROWS)],
        "team": [None if i % 7 == 0 else f"team-{i % 50}" for i in range(ROWS)],
    })
    return table.schema, table.to_batches(max_chunksize=BATCH)


def _trailer() -> dict:
    return {"consistency_token": "eyJsYiI6eyIwIjoxMjU2fX0", "stats": {"partitions_queried": 8, "rows": ROWS}}


def _timed(write: Callable[[], object], each: int) -> float:
    started = time.perf_counter()
    for _ in range(each):
        write()
    return (time.perf_counter() - started) / each


def _side_by_side(write: Callable[[], object], each: int = 1) -> tuple[float, float]:
    """The best time of ``write`` with the node's writer and with the baseline's, taken in
    turns (RUNS each), so that the host's slower moments fall on both."""
    ours = theirs = float("inf")
    for _ in range(RUNS):
        ours = min(ours, _timed(write, each))
        with _json_module():
            theirs = min(theirs, _timed(write, each))
    return ours, theirs


@contextlib.contextmanager
def _json_module() -> Iterator[None]:
    """The same path with the json module's encoder in place of orjson: the baseline."""
    node_writer = formats._encode
    formats._encode = lambda value: formats._encoder.encode(value).encode()
    try:
        yield
    finally:
        formats._encode = node_writer


def test_json_answers_beside_the_json_module(report: Report) -> None:
    schema, batches = _answer()
    one_schema = pa.schema([("player", pa.string()), ("total_score", pa.int64()), ("rank", pa.int64())])
    one_row = [("player-004740", 6_729_500, 3_242)]
    loads = {
        "JSON": lambda: b"".join(formats.json_chunks(schema, batches, _trailer)),
        "NDJSON": lambda: b"".join(formats.ndjson_chunks(schema, batches)),
    }
    progress(f"writing {ROWS:,} rows as JSON and NDJSON with each writer in turn, best of {RUNS}")
    lines = ["| answer | json module (baseline) | orjson (the node's) | × |", "|---|---|---|---|"]
    for name, write in loads.items():
        ours = write()
        with _json_module():
            theirs = write()
        assert _parsed(name, ours) == _parsed(name, theirs), f"the two writers' {name} differ"
        after, before = _side_by_side(write)
        lines.append(f"| {ROWS:,} rows as {name} | {before * 1e3:,.1f} ms ({ROWS / before:,.0f} rows/s) "
                     f"| {after * 1e3:,.1f} ms ({ROWS / after:,.0f} rows/s) | {before / after:.2f} |")
    after, before = _side_by_side(lambda: formats.json_rows_body(one_schema, one_row, _trailer()), each=20_000)
    lines.append(f"| one row (a rank's answer) | {before * 1e6:.1f} µs | {after * 1e6:.1f} µs | {before / after:.2f} |")
    report.section("JSON answers written in process (tests/bench/test_bench_json_answers.py)", [
        f"{ROWS:,} rows of text, BIGINT, DOUBLE, TIMESTAMP(ms), BOOLEAN and nullable text columns in batches of "
        f"{BATCH:,}, each body written whole; the one-row answer from Python values, 20,000 a run. Each writer "
        f"in turn, best of {RUNS} runs each; both writers' bodies parsed and compared, value for value.", "",
        *lines])


def _parsed(name: str, body: bytes) -> object:
    if name == "NDJSON":
        return [json.loads(line) for line in body.splitlines()]
    return json.loads(body)
