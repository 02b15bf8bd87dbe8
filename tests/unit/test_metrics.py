"""The node's Prometheus metrics against small fakes: the exposition parses, the SQL engine counts
each statement by kind and outcome (with its latency), the dispatcher counts its calls to other
nodes by peer and outcome, and the node's state (partitions by state from the cluster view,
its copies' lag and records applied, the scan cache, the store meter) is read at scrape time.
``GET /metrics`` needs no cluster secret."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest
from prometheus_client import REGISTRY as GLOBAL_REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from federator.catalog.definition import StoreDefinition
from federator.cluster.membership import ClusterView, NodeInfo
from federator.dispatch.client import NodeCallError
from federator.dispatch.dispatcher import Dispatcher
from federator.errors import SqlError
from federator.http.app import create_app
from federator.node.materializer import HostedShard
from federator.metrics import Metrics
from federator.owner.duck import Duck
from federator.plan.keys import SubQuery
from federator.query.owner_work import OwnerWork
from federator.query.position import PositionBound
from federator.query.queries import RangeQuery
from federator.query.result import FailureReason, QueryResult
from federator.route.read_options import ReadOptions
from federator.sql.engine import plan_kind
from federator.sql.result import SqlRequest
from federator.sql.service import SqlService
from federator.store.metered import Meter
from federator.store.scan_cache import ScanCache
from tests.registry import REGISTRY
from tests.unit import fake_node

PARTITIONS = 4


def definition(name: str = "s") -> StoreDefinition:
    return StoreDefinition.from_dict({"name": name, "type": "kv", "topic": f"t-{name}", "partitions": PARTITIONS,
                                      "key": {"name": "k", "format": "string"},
                                      "value": {"name": "v", "format": "long"}}, REGISTRY)


def info(node_id: str, active: list[int] = (), standby: list[int] = (), restoring: list[int] = ()) -> NodeInfo:
    return NodeInfo(node_id, f"{node_id}:1", "RUNNING", {"s": list(active)}, {"s": list(standby)},
                    restoring={"s": list(restoring)}, timestamp_ms=int(time.time() * 1000))


def samples(metrics: Metrics) -> dict[tuple[str, tuple], float]:
    """Every sample of the exposition, as text_string_to_metric_families reads it back."""
    from prometheus_client import generate_latest

    text = generate_latest(metrics.registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


class FakeNode(fake_node.FakeNode):
    """A node that owns every partition of store ``s`` and answers each with one row (or,
    with ``fail``, a store exception); it has no copies of its own to read locally, and its
    answers carry no positions: every statement asks it again."""

    def __init__(self) -> None:
        super().__init__(ClusterView(), {"s": definition()})
        self.state = "RUNNING"
        self.view.update_local(info("me", active=list(range(PARTITIONS))))
        self.fail = False

    def execute(self, req: Any) -> list[QueryResult]:
        if self.fail:
            return [QueryResult.failed(p, FailureReason.STORE_EXCEPTION, "disk on fire") for p in req.partitions]
        row = pa.RecordBatch.from_pylist([{"k": "a", "v": 1}], schema=self.stores["s"].arrow_schema())
        if req.work is not None and req.work.columns:  # the columns the statement reads
            row = row.select(list(req.work.columns))
        return [QueryResult(p, row if p == 0 else row.slice(0, 0)) for p in req.partitions]


def test_the_exposition_parses_with_the_query_counters_and_histograms() -> None:
    m = Metrics()
    m.query("point", "ok", 0.0002)
    m.query("point", "ok", 0.0003)
    m.query("scan", "TIMEOUT", 2.0)
    m.internal_call("n2", "query", "ok", 0.001)
    got = samples(m)
    assert got[("federator_sql_queries_total", (("kind", "point"), ("outcome", "ok")))] == 2
    assert got[("federator_sql_queries_total", (("kind", "scan"), ("outcome", "TIMEOUT")))] == 1
    assert got[("federator_sql_query_duration_seconds_count", (("kind", "point"),))] == 2
    assert got[("federator_sql_query_duration_seconds_bucket", (("kind", "point"), ("le", "0.00025")))] == 1
    assert got[("federator_internal_calls_total", (("call", "query"), ("outcome", "ok"), ("peer", "n2")))] == 1
    assert got[("federator_internal_call_duration_seconds_count", (("call", "query"),))] == 1
    # each node's own registry, never the process's global one
    assert GLOBAL_REGISTRY.get_sample_value("federator_sql_queries_total", {"kind": "point", "outcome": "ok"}) is None
    assert value(Metrics(), "federator_sql_queries_total", kind="point", outcome="ok") is None


def test_the_engine_counts_statements_by_kind_and_outcome() -> None:
    node = FakeNode()
    sql = SqlService(node, REGISTRY)
    m = sql.metrics

    def run(text: str, *params: Any, timeout_ms: int = 10_000) -> list[dict]:
        result = sql.sql(SqlRequest(text, list(params), timeout_ms=timeout_ms))
        return pa.Table.from_batches(list(result.batches), result.schema).to_pylist()

    assert run('SELECT * FROM s WHERE k = ?', "a") in ([{"k": "a", "v": 1}], [])
    assert run("SELECT k, v FROM s WHERE v > 0") == [{"k": "a", "v": 1}]
    assert run("SELECT 1 AS one") == [{"one": 1}]
    with pytest.raises(SqlError) as e:
        run("SELEC nonsense")
    parse_code = e.value.code
    with pytest.raises(SqlError):
        run("SELECT * FROM nope")
    node.fail = True
    with pytest.raises(SqlError) as e:
        run("SELECT k FROM s WHERE v > 1")
    owner_code = e.value.code

    assert value(m, "federator_sql_queries_total", kind="point", outcome="ok") == 1
    assert value(m, "federator_sql_queries_total", kind="scan", outcome="ok") == 1
    assert value(m, "federator_sql_queries_total", kind="other", outcome="ok") == 1
    assert value(m, "federator_sql_queries_total", kind="unknown", outcome=parse_code) == 1
    assert value(m, "federator_sql_queries_total", kind="unknown", outcome="UNKNOWN_STORE") == 1
    assert value(m, "federator_sql_queries_total", kind="scan", outcome=owner_code) == 1
    assert value(m, "federator_sql_query_duration_seconds_count", kind="scan") == 2
    assert value(m, "federator_sql_query_duration_seconds_count", kind="point") == 1


def test_a_plans_kind_is_told_in_one_place() -> None:
    def ref(**kw: Any) -> SimpleNamespace:
        return SimpleNamespace(**{"combine": None, "joined": None, "key_join": None,
                                  "work": OwnerWork(("k",)), **kw})

    def plan(*refs: SimpleNamespace) -> Any:
        return SimpleNamespace(refs=list(refs))

    assert plan_kind(plan()) == "other"
    assert plan_kind(plan(ref())) == "scan"
    assert plan_kind(plan(ref(work=OwnerWork(("k",), "SELECT count(*)", "partial aggregate")))) == "aggregate"
    assert plan_kind(plan(ref(joined="t"))) == "join"
    assert plan_kind(plan(ref(), ref())) == "join"
    assert plan_kind(plan(ref(combine=lambda fetch: None), ref())) == "plugin"


class ScriptedClient:
    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers

    def query(self, req: Any, timeout: float) -> list[QueryResult]:
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return [QueryResult(p) for p in req.partitions]


def test_the_dispatcher_counts_its_calls_by_peer_and_outcome() -> None:
    node = FakeNode()
    node.view.clear()
    node.view.update_local(info("n2", active=list(range(PARTITIONS))))
    m = Metrics()
    dispatcher = Dispatcher(node, metrics=m)
    dispatcher._clients["n2:1"] = ScriptedClient([NodeCallError("n2:1", "HTTP 403", 403, "FORBIDDEN"),
                                                  NodeCallError("n2:1", "no answer"), "ok"])
    options = ReadOptions(PositionBound.unbounded(), False, None, time.monotonic() + 5)
    dispatcher.gather("s", PARTITIONS, [SubQuery(RangeQuery(), None)], None, options)
    for outcome in ("FORBIDDEN", "NO_ANSWER", "ok"):
        assert value(m, "federator_internal_calls_total", peer="n2", call="query", outcome=outcome) == 1
    assert value(m, "federator_internal_call_duration_seconds_count", call="query") == 3


class FakeShard:
    def __init__(self, offset: int | None) -> None:
        self.offset = offset


def state_node() -> SimpleNamespace:
    """A node whose view has store s's partitions 0 active, 1 restoring, 2 and 3 uncovered (2
    with a standby elsewhere), and which hosts copies of 0 and 1 and a standby of 2."""
    view = ClusterView()
    view.update_local(info("me", active=[0, 1], restoring=[1]))
    view.update_local(info("n2", standby=[0, 2]))
    meter = Meter()
    meter.table("s", 0)["RangeQuery"] = [3, 30, 1, 2_000_000]
    meter.table("s", 1)["RangeQuery"] = [1, 5, 0, 1_000_000]
    return SimpleNamespace(
        node_id="me", state="RUNNING", cluster_secret="s3cret", stores={"s": definition()}, view=view,
        materializer=SimpleNamespace(snapshot=lambda: {
            ("s", 0): HostedShard(FakeShard(9), "active", restored=True, end_offset=10, applied=10),
            ("s", 1): HostedShard(FakeShard(3), "active", end_offset=10, applied=4),
            ("s", 2): HostedShard(FakeShard(None), "standby", applied=0),
        }),
        scan_cache=ScanCache(1 << 20), meter=meter, metrics=Metrics())


def test_the_node_state_is_read_at_scrape_time() -> None:
    node = state_node()
    m: Metrics = node.metrics
    m.watch(node)
    got = samples(m)

    def at(name: str, **labels: str) -> float | None:
        return got.get((name, tuple(sorted(labels.items()))))

    states = {s: at("federator_partitions", store="s", state=s) for s in ("active", "restoring", "uncovered")}
    assert states == {"active": 1, "restoring": 1, "uncovered": 2}
    assert sum(states.values()) == PARTITIONS
    assert at("federator_partition_standbys", store="s") == 2
    assert at("federator_live_nodes") == 2
    assert at("federator_node_info", node_id="me", state="RUNNING") == 1
    assert {s: at("federator_node_partitions", store="s", state=s) for s in ("active", "restoring", "standby")} == \
        {"active": 1, "restoring": 1, "standby": 1}
    assert at("federator_partition_lag_records", store="s", partition="0", role="active") == 0
    assert at("federator_partition_lag_records", store="s", partition="1", role="active") == 6
    assert at("federator_partition_lag_records", store="s", partition="2", role="standby") is None  # end unknown
    assert at("federator_partition_restored", store="s", partition="1", role="active") == 0
    assert at("federator_records_applied_total", store="s", partition="0") == 10
    assert at("federator_records_applied_total", store="s", partition="2") == 0
    assert at("federator_scan_cache_max_bytes") == 1 << 20
    assert at("federator_scan_cache_hits_total") == 0
    assert at("federator_store_queries_total", store="s", query_type="RangeQuery") == 4
    assert at("federator_store_rows_total", store="s", query_type="RangeQuery") == 35
    assert at("federator_store_failed_queries_total", store="s", query_type="RangeQuery") == 1
    assert at("federator_store_query_seconds_total", store="s", query_type="RangeQuery") == pytest.approx(0.003)
    # read again at the next scrape: the view changed, nothing was updated on the way
    node.view.update_local(info("n3", active=[2, 3]))
    assert value(m, "federator_partitions", store="s", state="uncovered") == 0


def test_duckdb_memory_is_reported_once_the_node_has_its_duckdb() -> None:
    class WithDuck:
        node_id, state = "me", "RUNNING"

    node = WithDuck()
    m = Metrics()
    m.watch(node)
    assert value(m, "federator_duckdb_memory_bytes") is None  # a scrape does not make it
    node.duck = Duck()
    assert value(m, "federator_duckdb_memory_bytes") >= 0
    assert value(m, "federator_duckdb_temporary_storage_bytes") >= 0


def test_get_metrics_needs_no_secret_and_speaks_prometheus_text() -> None:
    node = state_node()
    node.metrics.watch(node)
    node.metrics.query("point", "ok", 0.0001)
    client = create_app(node, REGISTRY).test_client()
    assert client.post("/internal/v1/query", data=b"{}").status_code == 403  # the secret still guards these
    resp = client.get("/metrics")
    assert resp.status_code == 200
    assert resp.headers["Content-Type"].startswith("text/plain; version=")
    names = {f.name for f in text_string_to_metric_families(resp.get_data(as_text=True))}
    assert {"federator_sql_queries", "federator_partitions", "federator_node_info"} <= names


def test_the_reference_names_every_metric_a_node_exposes() -> None:
    """(The dashboard is checked against running nodes: tests/integration/test_dashboard.py.)"""
    from pathlib import Path

    from prometheus_client import generate_latest

    class WithDuck(SimpleNamespace):
        pass

    node = WithDuck(**vars(state_node()))
    node.duck = Duck()
    node.metrics.watch(node)
    node.metrics.query("point", "ok", 0.0001)
    node.metrics.internal_call("n2", "key", "ok", 0.0001)
    text = generate_latest(node.metrics.registry).decode()
    root = Path(__file__).resolve().parents[2]
    readme = (root / "docs" / "reference" / "metrics.md").read_text()
    families = {f.name + ("_total" if f.type == "counter" else "")
                for f in text_string_to_metric_families(text) if not f.name.endswith("_created")}
    assert {name for name in families if f"`{name}`" not in readme} == set()
