"""The metering layer: what each store answers, counted per query type (queries, rows, failures,
time), the top of a store's stack as Kafka Streams' MeteredKeyValueStore is. One ``Meter`` per
node, shown in its metadata beside the scan cache's stats.

It is on the point lookup's path, so it costs a clock read on each side and an update of a
small list: nothing is formatted, locked or allocated per query.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from federator.query.position import PositionBound
from federator.query.queries import Query
from federator.store.layer import UNBOUNDED, LocalKeyQuery, StoreLayer, WrappedLayer

_QUERIES, _ROWS, _FAILED, _NANOS = range(4)
_now = time.perf_counter_ns


class Meter:
    """The counters of a node's metering layers, one table per store partition (kept when the
    partition closes and reused when it opens again), summed per store for the metadata."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tables: dict[tuple[str, int], dict[str, list[int]]] = {}

    def table(self, store: str, partition: int) -> dict[str, list[int]]:
        """query type -> [queries, rows, failed, nanoseconds], for one layer to update."""
        table = self._tables.get((store, partition))  # never dropped: no lock to find one (a global read asks each time)
        if table is None:
            with self._lock:
                table = self._tables.setdefault((store, partition), {})
        return table

    def stats(self) -> dict[str, dict[str, dict[str, float]]]:
        """{store: {query type: {queries, rows, failed, ms}}}, as node metadata shows it."""
        with self._lock:
            tables = list(self._tables.items())
        sums: dict[tuple[str, str], list[int]] = {}
        for (store, _), table in tables:
            for query_type, counts in list(table.items()):
                total = sums.setdefault((store, query_type), [0, 0, 0, 0])
                for i, n in enumerate(counts):
                    total[i] += n
        out: dict[str, dict[str, dict[str, float]]] = {}
        for (store, query_type), c in sorted(sums.items()):
            if not c[_QUERIES]:
                continue
            out.setdefault(store, {})[query_type] = {
                "queries": c[_QUERIES], "rows": c[_ROWS], "failed": c[_FAILED], "ms": round(c[_NANOS] / 1e6, 3),
            }
        return out


class MeteredLayer(WrappedLayer):
    """Counts what passes through to the layers below, by the query's type name.

    The counters are updated without a lock: a lock per query would cost as much as the rest
    of this layer, and two threads updating one partition's counter at the same instant can
    at worst lose one increment (the GIL keeps each list intact)."""

    answers_local_keys = True  # it counts them

    def __init__(self, inner: StoreLayer, meter: Meter) -> None:
        super().__init__(inner)
        self.meter = meter
        self._table = meter.table(inner.definition.name, inner.partition)
        self._key_counts = self._table.setdefault(LocalKeyQuery.type_name, [0, 0, 0, 0])

    def run(self, query: Query, bound: PositionBound = UNBOUNDED, collect_execution_info: bool = False) -> Any:
        if type(query) is LocalKeyQuery:  # the point lookup: straight to the layer that reads it (key_layer)
            started = _now()
            entry = self._run_key(query, bound)
            counts = self._key_counts
            counts[_NANOS] += _now() - started
            counts[_QUERIES] += 1
            if entry is None:  # this copy could not answer it
                counts[_FAILED] += 1
            elif entry[0] is not None:
                counts[_ROWS] += 1
            return entry
        started = _now()
        result = self.inner.run(query, bound, collect_execution_info)
        count(self._table, query, result, _now() - started)
        return result


def count(table: dict[str, list[int]], query: Query, result: Any, nanos: int) -> None:
    """One answer to ``query`` counted in a Meter's ``table`` (what a metering layer does, and
    what a global store's read of every partition at once does for itself, as it runs below
    no layer)."""
    counts = table.get(query.type_name)
    if counts is None:
        counts = table.setdefault(query.type_name, [0, 0, 0, 0])
    if result.failure is not None:
        counts[_FAILED] += 1
    elif result.batch is not None:
        counts[_ROWS] += result.batch.num_rows
    counts[_QUERIES] += 1
    counts[_NANOS] += nanos
