"""`spark.read.format("federator")`: a pipeline's live stores as a Spark DataFrame.

A PySpark Python data source (pyspark.sql.datasource). Register it once per session
(``federator_spark.source.register(spark)``), then:

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

Spark's filters on a store's columns are pushed into the store reads (``pushFilters``): the
ones on the key read only the partitions that can hold its values, with key lookups where the
store type has them, and each owner applies the rest in DuckDB before its rows leave it, so
Spark gets only matching rows. Filters on timestamps, on nested fields and on an ``sql``
answer stay with Spark. PySpark asks for ``spark.sql.python.filterPushdown.enabled`` to be
true for a reader that takes filters; ``register`` sets it. Column pruning is not offered to
Python data sources: every column is read (``sql`` projects on the node).
"""

from __future__ import annotations

import json
import time
import urllib.parse
from typing import Any, Iterator

from dataclasses import dataclass

from pyspark.sql.datasource import (DataSource, DataSourceArrowWriter, DataSourceReader,
                                    DataSourceStreamArrowWriter, InputPartition, WriterCommitMessage)

NAME = "federator"


def register(spark: Any) -> None:
    """Make ``format("federator")`` known to ``spark`` (once per session), with Python data
    sources' filter pushdown on (PySpark refuses a reader that takes filters without it)."""
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
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

    def writer(self, schema: Any, overwrite: bool) -> DataSourceArrowWriter:
        return FederatorWriter(self.options, schema, overwrite)

    def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamArrowWriter:
        return FederatorStreamWriter(self.options, schema, overwrite)


class FederatorReader(DataSourceReader):
    def __init__(self, opts: _Options, schema: Any) -> None:
        from pyspark.sql.pandas.types import to_arrow_schema

        self.opts = opts
        # what Spark takes from read(), to the unit (timestamps as UTC instants, as the nodes answer)
        self.arrow_schema = to_arrow_schema(schema, timezone="UTC")
        self.where: list[str] = []  # the filters Spark pushed here, as DuckDB conjuncts over the store's rows

    def pushFilters(self, filters: list[Any]) -> Iterator[Any]:
        """Keep the filters a store read can apply (as SQL over its columns); give the rest back."""
        columns = {n.lower(): n for n in self.arrow_schema.names} if self.opts.store else {}
        for f in filters:
            sql = filter_sql(f, columns, self.arrow_schema)
            if sql is None:
                yield f
            else:
                self.where.append(sql)

    def partitions(self) -> list[InputPartition]:
        if self.opts.sql:
            return [InputPartition(None)]
        from federator.plugin import load_plugins

        info = json.loads(_public(self.opts, "GET", f"/v1/stores/{urllib.parse.quote(self.opts.store)}").data)
        registry = load_plugins()
        if not self.where:
            # every row of a partition, as the store type reads all of it (RangeQuery for kv, a
            # WindowRangeQuery for window and session stores, a plugin's own)
            scan = registry.store_type(info["type"]).full_scan_query()
            return [InputPartition((p["partition"], scan, None)) for p in info["partition_owners"]]
        import sqlglot

        from federator.catalog.definition import StoreDefinition
        from federator.owner.work import ROWS
        from federator.plan.keys import plan_store_queries
        from federator.query.owner_work import OwnerWork

        shown = ("columns", "partition_owners", "scope")  # what /v1/stores adds to the definition
        defn = StoreDefinition.from_dict({k: v for k, v in info.items() if k not in shown}, registry)
        where = sqlglot.parse_one(" AND ".join(f"({c})" for c in self.where), read="duckdb")
        # the engine's own planning: key filters become key queries on the partitions that hold them
        subqueries = plan_store_queries(defn, where, [])
        names = tuple(self.arrow_schema.names)
        select = ", ".join(f'"{n}"' for n in names)
        work = OwnerWork(names, f"SELECT {select} FROM {ROWS} WHERE {where.sql(dialect='duckdb')}", "filter")
        return [InputPartition((p, sq.query, work)) for sq in subqueries
                for p in (sq.partitions if sq.partitions is not None else range(defn.partitions))]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if self.opts.sql:
            table = _arrow(_public(self.opts, "POST", "/v1/sql", _sql_body(self.opts, self.opts.sql)).data)
            yield from table.to_batches()
            return
        number, query, work = partition.value
        yield from _read_partition(self.opts, number, query, self.arrow_schema, work)


def filter_sql(f: Any, columns: dict[str, str], schema: Any) -> str | None:
    """A Spark data source filter as a DuckDB condition over the store's ``columns`` (lower-case
    name -> name), or None where it cannot go to the owners exactly: a nested or unknown
    column, a timestamp (its value's zone is Spark's session's) or a value of another type."""
    import datetime as dt
    import decimal

    import pyarrow as pa
    from pyspark.sql import datasource as ds
    from sqlglot import exp

    from federator.sql.planner import literal

    def column(attribute: tuple[str, ...]) -> str | None:
        if len(attribute) != 1 or attribute[0].lower() not in columns:
            return None
        name = columns[attribute[0].lower()]
        t = schema.field(name).type
        if pa.types.is_timestamp(t) or pa.types.is_time(t) or pa.types.is_nested(t):
            return None
        return name

    def value(v: Any) -> exp.Expression | None:
        if isinstance(v, (bool, int, float, str, decimal.Decimal, bytes)) or \
                (isinstance(v, dt.date) and not isinstance(v, dt.datetime)):
            return literal(v)
        return None

    if isinstance(f, ds.Not):
        inner = filter_sql(f.child, columns, schema)
        return None if inner is None else f"NOT ({inner})"
    name = column(f.attribute)
    if name is None:
        return None
    col = exp.column(name, quoted=True)
    if isinstance(f, ds.IsNull):
        return exp.Is(this=col, expression=exp.Null()).sql(dialect="duckdb")
    if isinstance(f, ds.IsNotNull):
        return exp.Not(this=exp.Is(this=col, expression=exp.Null())).sql(dialect="duckdb")
    if isinstance(f, ds.In):
        values = [value(v) for v in f.value]
        if not values or any(v is None for v in values):
            return None
        return exp.In(this=col, expressions=values).sql(dialect="duckdb")
    compare = {ds.EqualTo: exp.EQ, ds.EqualNullSafe: exp.NullSafeEQ, ds.GreaterThan: exp.GT,
               ds.GreaterThanOrEqual: exp.GTE, ds.LessThan: exp.LT, ds.LessThanOrEqual: exp.LTE}.get(type(f))
    if compare is not None:
        v = value(f.value)
        return None if v is None else compare(this=col, expression=v).sql(dialect="duckdb")
    text = {ds.StringStartsWith: "starts_with", ds.StringEndsWith: "ends_with", ds.StringContains: "contains"}.get(type(f))
    if text is not None and isinstance(f.value, str):
        return exp.Anonymous(this=text, expressions=[col, exp.Literal.string(f.value)]).sql(dialect="duckdb")
    return None


def _read_partition(opts: _Options, partition: int, scan: Any, schema: Any, work: Any = None) -> list[Any]:
    """One store partition's rows from its owner (or a standby at the bound), as Arrow; ``work``:
    the filters the owner applies first (an OwnerWork), or None for every row."""
    from federator.dispatch.client import NodeCallError, NodeClient
    from federator.query.position import Position, PositionBound
    from federator.query.request import StateQueryRequest

    bound = PositionBound.at(Position.from_token(opts.token)) if opts.token else PositionBound.unbounded()
    request = StateQueryRequest(opts.store, scan, (partition,), bound, work=work)
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

                if result.batch is None:
                    return []
                table = pa.Table.from_batches([result.batch])
                return table.select(schema.names).cast(schema).to_batches()
            why = f"{endpoint}: {result.failure} {result.message}"
        if time.monotonic() >= deadline:
            raise RuntimeError(f"store {opts.store!r} partition {partition} could not be read within "
                               f"{opts.timeout_ms} ms: {why}; raise option('timeout_ms') or check the nodes")
        time.sleep(delay)
        delay = min(1.0, delay * 2)


# ---- writing: df.write.format("federator") -------------------------------------------------

TOKEN_DIR = "federator-write-tokens"


def token_path(application_id: str, store: str) -> str:
    """Where a format write leaves its consistency token unless option("token_file") names a file."""
    import os
    import tempfile

    return os.path.join(tempfile.gettempdir(), TOKEN_DIR, f"{application_id}.{store}.token")


def last_write_token(application_id: str, store: str, token_file: str | None = None) -> str:
    """The consistency token of the last format write of ``store`` on this machine (the driver's)."""
    with open(token_file or token_path(application_id, store)) as f:
        return f.read().strip()


@dataclass
class _Written(WriterCommitMessage):
    rows: list[dict]  # per Kafka partition: its last offset and records; replace mode: the keys seen


class FederatorWriter(DataSourceArrowWriter):
    """Writes as write_store does, but in one pass: each Spark task checks its own rows and
    produces them. Options as write_store's arguments: store, key, value (a column, or
    columns separated by commas for a JSON record), type, partitions, bootstrap_servers,
    kafka_config (a file of the cluster's Kafka client properties), application_id, window_start, window_size_ms, session_start, session_end; mode("append")
    upserts, mode("overwrite") replaces. What write_store checks across all rows before anything
    is written (duplicate keys) is not checked, and a failed task leaves the rows other tasks
    wrote: use write_store where that matters."""

    def __init__(self, options: Any, schema: Any, overwrite: bool) -> None:
        import time as _time

        from federator.catalog import Catalog, changelog_topic
        from federator.plugin import load_plugins
        from federator_spark.sink.checks import check_store
        from federator_spark.sink.deletes import live_keys
        from federator_spark.sink.errors import SinkError
        from federator_spark.sink.plan import Columns, shape
        from federator_spark.sink.producing import WriteSpec, producer_config

        get = lambda name: options.get(name) or None  # noqa: E731
        store, app, bootstrap = get("store"), get("application_id"), get("bootstrap_servers")
        if not store or not get("key") or not app or not bootstrap:
            raise SinkError('pass option("store", NAME), option("key", COLUMN), option("bootstrap_servers", '
                            '"HOST:PORT") and option("application_id", APP)')
        value = get("value")
        if value is not None and "," in value:
            value = [v.strip() for v in value.split(",") if v.strip()]

        def number(name: str, default: int | None) -> int | None:
            text = get(name)
            if text is None:
                return default
            try:
                return int(text)
            except ValueError:
                raise SinkError(f"option {name!r} must be a whole number, not {text!r}") from None

        def flag(name: str) -> bool:
            text = (get(name) or "false").lower()
            if text not in ("true", "false"):
                raise SinkError(f"option {name!r} must be true or false, not {get(name)!r}")
            return text == "true"

        registry = load_plugins()
        config = producer_config(bootstrap, get("kafka_config"))  # before the first Kafka client
        self.shape = shape(Columns(schema), store, key=get("key"), value=value, type=get("type") or "kv",
                           partitions=number("partitions", 8), topic=changelog_topic(app, store),
                           window_start=get("window_start"), window_size_ms=number("window_size_ms", None),
                           session_start=get("session_start"), session_end=get("session_end"), registry=registry,
                           global_store=flag("global"))
        catalog = Catalog(bootstrap, app, registry)
        defn, exists = check_store(catalog, self.shape.defn)
        # what the tasks need of the shape (the definition holds the registry, which stays here)
        self.shape = _Columns(self.shape.layout, self.shape.key, self.shape.value, self.shape.window_start,
                              self.shape.session_start, self.shape.session_end)
        catalog.register(defn)
        self.timeout = float(get("timeout_s") or 120)
        self.existing_keys = sorted(live_keys(bootstrap, defn.topic, defn.partitions, self.timeout)) \
            if overwrite and exists else []
        self.bootstrap, self.app, self.store, self.topic = bootstrap, app, store, defn.topic
        self.token_file = get("token_file")
        self.now_ms = int(_time.time() * 1000)
        self.value_fields = list(defn.value_fields)
        self.spec = WriteSpec(
            bootstrap_servers=bootstrap, topic=defn.topic, partitions=defn.partitions,
            layout=defn.store_type.changelog_layout, key=defn.key,
            value=None if self.value_fields else defn.value, now_ms=self.now_ms, producer_config=config,
            flush_timeout=self.timeout,
            existing=_Held({k: i for i, k in enumerate(self.existing_keys)}) if self.existing_keys else None)
        self.defn_dict = defn.to_dict()

    def write(self, iterator: Iterator[Any]) -> _Written:
        import dataclasses
        import time as _time

        from federator_spark.sink.producing import produce_batches

        spec = dataclasses.replace(self.spec, now_ms=int(_time.time() * 1000))  # kv records' time: this write's
        result = produce_batches(spec, (_encoded(self, b) for b in iterator))
        return _Written(result.to_pylist())

    def commit(self, messages: list[_Written]) -> None:
        self._record(self._token(messages))

    def _record(self, token: str, batch_id: int | None = None) -> None:
        import os

        path = self.token_file or token_path(self.app, self.store)
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path + ".tmp", "w") as f:
            f.write(token + "\n")
        os.replace(path + ".tmp", path)  # a reader sees the old token or the new, never half
        if batch_id is not None:
            with open(path + ".batch.tmp", "w") as f:
                f.write(f"{batch_id}\n")
            os.replace(path + ".batch.tmp", path + ".batch")

    def _token(self, messages: list[_Written]) -> str:
        from federator.query.position import Position
        from federator_spark.sink.deletes import tombstones, unmarked

        offsets: dict[int, int] = {}
        seen = 0
        for message in messages:
            for r in message.rows:
                if r["partition"] < 0:
                    seen |= int.from_bytes(r["seen"], "little")
                    continue
                offsets[r["partition"]] = max(offsets.get(r["partition"], -1), r["offset"])
        if self.existing_keys:
            gone = unmarked(self.existing_keys, seen)
            if gone:
                from federator.catalog import StoreDefinition
                from federator.plugin import load_plugins

                defn = StoreDefinition.from_dict(self.defn_dict, load_plugins())
                for p, o in tombstones(self.bootstrap, defn, gone, self.now_ms, self.timeout).items():
                    offsets[p] = max(offsets.get(p, -1), o)
        return Position({self.topic: offsets}).to_token()

    def abort(self, messages: list[_Written]) -> None:
        pass  # records the finished tasks produced stay in the changelog (as upserts); nothing to undo


@dataclass(frozen=True)
class _Columns:
    layout: str
    key: str
    value: Any
    window_start: str | None
    session_start: str | None
    session_end: str | None


class FederatorStreamWriter(FederatorWriter, DataSourceStreamArrowWriter):
    """`df.writeStream.format("federator")`: each micro-batch's rows upserted as a format write
    does. Spark takes Python data sources' streams in append mode only, so a stream of rows
    whose keys are upserted (the latest value per key); a running aggregate (update mode) goes
    through foreachBatch and write_store, as the game_events --stream job does.

    Commit records the batch's token (and, beside it in ``<token file>.batch``, the batch id),
    and the store as written by that micro-batch beside the query's checkpoint
    (``federator_spark.sink.written_batches``). A micro-batch that Spark runs again because it stopped
    after that record but before its own (``commits/``) writes nothing: its tasks see the
    record and produce no rows. One stopped before the record is written again, whole."""

    def __init__(self, options: Any, schema: Any, overwrite: bool) -> None:
        from federator_spark.sink.errors import SinkError
        from federator_spark.sink.written_batches import WrittenBatches

        if overwrite:
            raise SinkError("a streaming write upserts each micro-batch's rows: use outputMode('append')")
        super().__init__(options, schema, False)
        # Spark passes the query's checkpointLocation among the options (lower-cased); kept as
        # a path made absolute here (a task's working folder is not the driver's), not as a
        # WrittenBatches, as the writer is pickled to the tasks; a location it cannot open
        # fails the query now, saying so
        checkpoint = options.get("checkpointlocation") or options.get("checkpointLocation") or None
        self.checkpoint = WrittenBatches(checkpoint).location if checkpoint is not None else None

    def write(self, iterator: Iterator[Any]) -> _Written:
        from federator_spark.sink.written_batches import WrittenBatches, task_batch_id

        batch_id = task_batch_id()
        if self.checkpoint is not None and batch_id is not None \
                and self.store in WrittenBatches(self.checkpoint).of(batch_id):
            return _Written([])  # this micro-batch's rows are in the changelog already
        return super().write(iterator)

    def commit(self, messages: list[_Written], batchId: int) -> None:  # type: ignore[override]
        from federator_spark.sink.written_batches import WrittenBatches

        written = WrittenBatches(self.checkpoint) if self.checkpoint is not None else None
        token = written.of(batchId).get(self.store) if written is not None else None
        if token is None:
            token = self._token(messages)
            if written is not None:
                written.record(batchId, self.store, token)
        self._record(token, batchId)

    def abort(self, messages: list[_Written], batchId: int) -> None:  # type: ignore[override]
        pass  # what finished tasks produced stays (upserts); Spark runs the batch again


class _Held:
    """A value as a Spark broadcast offers it (WriteSpec.existing), for the format's writer."""

    def __init__(self, value: Any) -> None:
        self.value = value


def _encoded(writer: FederatorWriter, batch: Any) -> Any:
    """A task's raw rows as the producer takes them (columns k, v[, t1[, t2]], bad), each row
    checked as write_store checks it; a row that fails stops the task saying why."""
    import json as _json

    import pyarrow as pa
    import pyarrow.compute as pc

    s = writer.shape
    store = writer.store

    def column(name: str) -> Any:
        return batch.column(batch.schema.get_field_index(name))

    def no_nulls(name: str, what: str) -> Any:
        c = column(name)
        if c.null_count:
            raise ValueError(f"store {store!r}: {what} column {name!r} has {c.null_count} null values in this task's "
                             "rows; filter them out or fill them")
        return c

    def millis(name: str, what: str) -> Any:
        c = no_nulls(name, what)
        if pa.types.is_timestamp(c.type):
            c = pc.cast(pc.cast(c, pa.timestamp("ms", tz=c.type.tz)), pa.int64())
        if pc.any(pc.less(c, 0)).as_py():
            raise ValueError(f"store {store!r}: {what} column {name!r} has values before 1970-01-01")
        return c

    out = {"k": no_nulls(s.key, "key")}
    if writer.value_fields:
        columns = {}
        for name, ftype in writer.value_fields:
            c = column(name)
            if ftype == "timestamp":
                c = pc.cast(pc.cast(c, pa.timestamp("ms", tz=getattr(c.type, "tz", None))), pa.int64())
            elif ftype == "double" and pc.any(pc.or_(pc.is_nan(c), pc.is_inf(c))).as_py():
                raise ValueError(f"store {store!r}: value column {name!r} has NaN or infinite values, which JSON "
                                 "cannot hold")
            columns[name] = c.to_pylist()
        docs = [_json.dumps(dict(zip(columns, values)), separators=(",", ":")).encode()
                for values in zip(*columns.values())]
        out["v"] = pa.array(docs, pa.binary())
    else:
        out["v"] = no_nulls(s.value, "value")
    if s.layout == "window":
        out["t1"] = millis(s.window_start, "window start")
    elif s.layout == "session":
        out["t1"] = millis(s.session_start, "session start")
        out["t2"] = millis(s.session_end, "session end")
        if pc.any(pc.less(out["t2"], out["t1"])).as_py():
            raise ValueError(f"store {store!r}: sessions end before they start; swap the columns or fix the rows")
    out["bad"] = pa.array([False] * batch.num_rows)
    return pa.RecordBatch.from_pydict(out)
