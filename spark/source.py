"""`spark.read.format("federator")`: a pipeline's live stores as a Spark DataFrame.

A PySpark Python data source (pyspark.sql.datasource). Register it once per session
(``spark.source.register(spark)``), then:

    spark.read.format("federator").option("url", "http://node:8080").option("store", "player_stats").load()
    spark.read.format("federator").option("url", "http://node:8080").option("sql", "SELECT ...").load()

- ``store``: one Spark input partition per store partition, each read by a Spark task from the
  partition's active owner over the nodes' internal Arrow endpoint (the store type's full-scan
  query, as the SQL engine sends it). A partition whose owner moved is asked of its new owner,
  or of a standby that has reached the bound, until ``timeout_ms``.
- ``sql``: the statement runs on the node (routing, pushdown and DuckDB there); one input
  partition reads its Arrow answer.
- ``consistency_token``: every partition is read at least that far (a writer's token gives
  read-your-writes). ``cluster_secret``: the nodes' ``--cluster-secret``, for the internal
  endpoint. ``auth_token``: a bearer token of the nodes' ``--users-file``.

Spark's filters and column pruning are not pushed into the store reads; use ``sql`` to have
the node filter, project and aggregate before the rows reach Spark.
"""

from __future__ import annotations

import json
import time
import urllib.parse
from typing import Any, Iterator

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

NAME = "federator"


def register(spark: Any) -> None:
    """Make ``format("federator")`` known to ``spark`` (once per session)."""
    spark.dataSource.register(FederatorDataSource)


class _Options:
    """The reader's options, checked once: each refusal says what to pass."""

    def __init__(self, options: Any) -> None:
        get = lambda name: options.get(name) or None  # noqa: E731 - the options map is case-insensitive
        url = get("url")
        if not url:
            raise ValueError('option("url", "http://HOST:PORT[,HOST2:PORT2]"): the nodes to ask is missing')
        self.nodes = [u if "://" in u else f"http://{u}" for u in (p.strip() for p in url.split(",")) if u]
        self.store, self.sql = get("store"), get("sql")
        if bool(self.store) == bool(self.sql):
            raise ValueError('pass option("store", NAME) to read a store, or option("sql", "SELECT ...") to read '
                             "an answer (one of the two)")
        self.token = get("consistency_token")
        self.secret = get("cluster_secret")
        self.auth = get("auth_token")
        self.timeout_ms = int(get("timeout_ms") or 60_000)


def _http(opts: _Options) -> Any:
    import urllib3

    return urllib3.PoolManager(retries=False)


def _public(opts: _Options, method: str, path: str, body: dict | None = None) -> Any:
    """``path`` of the first node that answers (a node that does not is skipped)."""
    headers = {"Content-Type": "application/json"}
    if opts.auth:
        headers["Authorization"] = f"Bearer {opts.auth}"
    http, last = _http(opts), None
    for node in opts.nodes:
        try:
            resp = http.request(method, node + path, body=None if body is None else json.dumps(body).encode(),
                                headers=headers, timeout=opts.timeout_ms / 1000)
        except Exception as e:  # noqa: BLE001 - try the next node
            last = f"{node}: {type(e).__name__}: {e}"
            continue
        if resp.status != 200:
            raise RuntimeError(f"{node}{path} answered {resp.status}: {resp.data[:500].decode('utf-8', 'replace')}")
        return resp
    raise RuntimeError(f"no node of {opts.nodes} answered ({last}); check option('url')")


def _sql_body(opts: _Options, sql: str) -> dict:
    return {"sql": sql, "format": "arrow", "consistency_token": opts.token, "timeout_ms": opts.timeout_ms}


def _arrow(data: bytes) -> Any:
    import pyarrow as pa

    return pa.ipc.open_stream(data).read_all()


class FederatorDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> Any:
        from pyspark.sql.pandas.types import from_arrow_schema

        opts = _Options(self.options)
        sql = opts.sql if opts.sql else f'SELECT * FROM "{opts.store}"'
        table = _arrow(_public(opts, "POST", "/v1/sql", _sql_body(opts, f"SELECT * FROM ({sql}) LIMIT 0")).data)
        return from_arrow_schema(table.schema)

    def reader(self, schema: Any) -> DataSourceReader:
        return FederatorReader(_Options(self.options), schema)


class FederatorReader(DataSourceReader):
    def __init__(self, opts: _Options, schema: Any) -> None:
        from pyspark.sql.pandas.types import to_arrow_schema

        self.opts = opts
        # what Spark takes from read(), to the unit (timestamps as UTC instants, as the nodes answer)
        self.arrow_schema = to_arrow_schema(schema, timezone="UTC")

    def partitions(self) -> list[InputPartition]:
        if self.opts.sql:
            return [InputPartition(None)]
        from federator.plugin import load_plugins

        info = json.loads(_public(self.opts, "GET", f"/v1/stores/{urllib.parse.quote(self.opts.store)}").data)
        # every row of a partition, as the store type reads all of it (RangeQuery for kv, a
        # WindowRangeQuery for window and session stores, a plugin's own)
        scan = load_plugins().store_type(info["type"]).full_scan_query()
        return [InputPartition((p["partition"], scan)) for p in info["partition_owners"]]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if self.opts.sql:
            table = _arrow(_public(self.opts, "POST", "/v1/sql", _sql_body(self.opts, self.opts.sql)).data)
            yield from table.to_batches()
            return
        number, scan = partition.value
        yield from _read_partition(self.opts, number, scan, self.arrow_schema)


def _read_partition(opts: _Options, partition: int, scan: Any, schema: Any) -> list[Any]:
    """One store partition's rows from its owner (or a standby at the bound), as Arrow."""
    from federator.dispatch.client import NodeCallError, NodeClient
    from federator.query.position import Position, PositionBound
    from federator.query.request import StateQueryRequest

    bound = PositionBound.at(Position.from_token(opts.token)) if opts.token else PositionBound.unbounded()
    request = StateQueryRequest(opts.store, scan, (partition,), bound)
    deadline = time.monotonic() + opts.timeout_ms / 1000
    why = "no owner yet"
    delay = 0.05
    while True:
        info = json.loads(_public(opts, "GET", f"/v1/stores/{urllib.parse.quote(opts.store)}").data)
        owners = next(p for p in info["partition_owners"] if p["partition"] == partition)
        endpoints = ([owners["active"]["endpoint"]] if owners.get("active") else []) + \
            [s["endpoint"] for s in owners.get("standbys", [])]
        for endpoint in endpoints:
            try:
                (result,) = NodeClient(endpoint, opts.secret, timeout=max(1.0, deadline - time.monotonic())).query(request)
            except NodeCallError as e:
                why = str(e)
                continue
            if result.ok:  # the shard's rows as the answer's schema (timestamps in ms there, us here)
                import pyarrow as pa

                table = pa.Table.from_batches([result.batch])
                return table.select(schema.names).cast(schema).to_batches()
            why = f"{endpoint}: {result.failure} {result.message}"
        if time.monotonic() >= deadline:
            raise RuntimeError(f"store {opts.store!r} partition {partition} could not be read within "
                               f"{opts.timeout_ms} ms: {why}; raise option('timeout_ms') or check the nodes")
        time.sleep(delay)
        delay = min(1.0, delay * 2)
