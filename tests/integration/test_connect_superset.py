"""Apache Superset 6.1 against the shared three-node cluster, through Superset's own REST API, as
its pages call it: Federator added as ``federator://`` (the dialect and engine spec) and as
``postgresql://`` (a node's Postgres port); the dataset editor's schemas, tables and columns;
chart data at every time grain Superset offers for each, and the same statements in SQL Lab, each
answer equal to DuckDB's over the same rows; a dashboard opened in headless Chromium.

Superset runs in its own environment (tests/integration/superset_env.py, cached). The module
sorts beside test_connect_postgres.py and test_console.py, so all use one ``bi_cluster``.
"""

from __future__ import annotations

import datetime as dt
import html
import os
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
from PIL import Image

from federator.sqla.superset import TIME_GRAIN_EXPRESSIONS
from tests.conftest import dies_with_tests, free_port
from tests.integration import superset_env
from tests.integration.bi_cluster import BASE_MS, BiCluster, bi_cluster, unqualified  # noqa: F401 - a fixture
from tests.integration.superset_api import DemoSpec, Provisioned, SupersetApi, metric, provision
from tests.integration.test_connect_names import bag
from tests.integration.test_console import CHROMIUM

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is missing: make test installs it")]

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOT = ROOT / "docs" / "images" / "superset-dashboard.png"
SPEC = DemoSpec(store="per_minute", key="player", time="window_start", metric="points", virtual_name="team_minutes",
                virtual_sql="SELECT m.player, m.window_start, m.points, p.team FROM per_minute m "
                            "JOIN players p ON m.player = p.player",
                series="team", title="Federator: players")
SCHEMAS = {"federator": "main", "postgresql": "public"}
READ = {"federator": "duckdb", "postgresql": "postgres"}  # the SQL Superset writes for each
# the grains Superset offers: every one it names through federator://, its PostgreSQL spec's 14
OFFERED = {"federator": set(TIME_GRAIN_EXPRESSIONS) - {None},
           "postgresql": {"PT1S", "PT5S", "PT30S", "PT1M", "PT5M", "PT10M", "PT15M", "PT30M", "PT1H", "P1D", "P1W",
                          "P1M", "P3M", "P1Y"}}
_provisioned: dict[str, Provisioned] = {}


@pytest.fixture(scope="module")
def superset(tmp_path_factory) -> Iterator[SupersetApi]:
    with superset_env.running(tmp_path_factory.mktemp("superset"), free_port(), dies_with_tests()) as server:
        yield SupersetApi(server.url, *superset_env.ADMIN)


@pytest.fixture
def site(bi_cluster, superset) -> Provisioned:
    """The databases, datasets, charts and dashboard, added once per cluster."""
    c = bi_cluster
    if c.app_id not in _provisioned:
        node, *others = c.nodes
        fed = f"federator://{node.endpoint}?hosts=" + ",".join(n.endpoint for n in others)
        pg = f"postgresql://superset@127.0.0.1:{c.nodes[1].pg_port}/federator"
        _provisioned[c.app_id] = provision(superset, SPEC, fed, pg)
    return _provisioned[c.app_id]


def test_the_dataset_editor_lists_schemas_tables_and_columns(superset, site) -> None:
    for db, schema in SCHEMAS.items():
        database = site.databases[db]
        assert superset.get(f"/api/v1/database/{database}/schemas/", q={"force": True})["result"] == [schema]
        tables = superset.get(f"/api/v1/database/{database}/tables/", q={"force": True, "schema_name": schema})
        assert sorted(t["value"] for t in tables["result"]) == ["blobs", "per_minute", "players"], (db, tables)
        meta = superset.get(f"/api/v1/database/{database}/table_metadata/", name="players", schema=schema)
        columns = {c["name"]: c["type"] for c in meta["columns"]}
        assert list(columns) == ["player", "team", "games", "score", "active", "last_seen", "rowtime"], (db, meta)
        assert meta["selectStar"].split("FROM")[1].split()[0] == f"{schema}.players", meta["selectStar"]
        dataset = superset.get(f"/api/v1/dataset/{site.datasets[(db, 'store')]}")["result"]
        dttm = {c["column_name"] for c in dataset["columns"] if c["is_dttm"]}
        assert dttm == {"window_start", "window_end", "rowtime"}, (db, dataset["columns"])


def grains(superset: SupersetApi, dataset: int) -> list[str]:
    return [g for g, _ in superset.get(f"/api/v1/dataset/{dataset}")["result"]["time_grain_sqla"]]


def chart_query(dataset: int, grain: str, series: str, excluded: str) -> dict[str, Any]:
    """A time series as the bar chart asks for it: SUM by time bucket and ``series``, filtered by
    a time range, a NOT IN and a metric bound, ordered fully, limited."""
    start, end = (dt.datetime.fromtimestamp((BASE_MS + m * 60_000) / 1000, dt.timezone.utc).replace(tzinfo=None)
                  for m in (5, 70))
    return {"datasource": {"id": dataset, "type": "table"}, "force": True, "result_type": "full",
            "result_format": "json", "queries": [{
                "columns": [{"timeGrain": grain, "columnType": "BASE_AXIS", "sqlExpression": SPEC.time,
                             "label": "bucket", "expressionType": "SQL"}, series],
                "metrics": [metric(SPEC.metric)],
                "filters": [{"col": SPEC.time, "op": "TEMPORAL_RANGE",
                             "val": f"{start.isoformat()} : {end.isoformat()}"},
                            {"col": series, "op": "NOT IN", "val": [excluded]},
                            {"col": SPEC.metric, "op": ">", "val": 0}],
                "orderby": [["total", False], ["bucket", True], [series, True]],
                "row_limit": 12, "extras": {"time_grain_sqla": grain}, "post_processing": []}]}


def epoch_ms(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return int(value.replace(tzinfo=value.tzinfo or dt.timezone.utc).timestamp() * 1000)
    if isinstance(value, str) and value[:2] == "20" and "-" in value:
        return epoch_ms(dt.datetime.fromisoformat(value))
    return value


def rows(records: list[dict], columns: list[str]) -> list[tuple]:
    return [tuple(epoch_ms(r[c]) for c in columns) for r in records]


def duckdb_rows(c: BiCluster, sql: str, db: str) -> list[tuple]:
    return [tuple(epoch_ms(v) for v in r) for r in c.db.execute(unqualified(sql, READ[db])).fetchall()]


@pytest.mark.parametrize("db", SCHEMAS)
def test_chart_data_at_every_time_grain_and_the_same_in_sql_lab(bi_cluster, superset, site, db) -> None:
    for kind, series, excluded in (("store", "player", "p003"), ("virtual", "team", "blue")):
        dataset = site.datasets[(db, kind)]
        offered = grains(superset, dataset)
        assert set(offered) == OFFERED[db], offered
        for grain in offered:
            answer = superset.post("/api/v1/chart/data", chart_query(dataset, grain, series, excluded))["result"][0]
            sql = answer["query"]
            want = duckdb_rows(bi_cluster, sql, db)
            assert len(want) >= 2, (db, kind, grain, sql)
            got = rows(answer["data"], ["bucket", series, "total"])
            assert got == want, (db, kind, grain, sql, got, want)
            lab = superset.post("/api/v1/sqllab/execute/", {
                "database_id": site.databases[db], "sql": sql, "schema": SCHEMAS[db], "runAsync": False,
                "client_id": uuid.uuid4().hex[:10], "queryLimit": 1000, "select_as_cta": False, "expand_data": True})
            assert lab["status"] == "success", lab
            # SQL Lab puts its own row cap (queryLimit) in place of the statement's LIMIT
            executed = lab["query"]["executedSql"]
            assert rows(lab["data"], [c["column_name"] for c in lab["columns"]]) == duckdb_rows(
                bi_cluster, executed, db), (db, kind, grain, executed)


def test_the_dashboard_shows_both_charts_data_in_chromium(bi_cluster, superset, site, tmp_path) -> None:
    """Signed in by posting the login form (then sent on to the dashboard), Chromium draws both
    charts: the table's cells are the top players by points (DuckDB's), and the bar chart's bars
    are drawn in Superset's series colours."""
    login = tmp_path / "login.html"
    login.write_text(
        f'<form method="post" action="{superset.url}/login/?next=/superset/dashboard/{site.dashboard}/%3Fstandalone%3D1">'
        f'<input name="username" value="{superset_env.ADMIN[0]}"><input name="password" value="{superset_env.ADMIN[1]}">'
        "</form><script>document.forms[0].submit()</script>")
    args = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
            "--hide-scrollbars", "--window-size=1280,800", "--virtual-time-budget=30000",
            "--run-all-compositor-stages-before-draw"]
    top = bi_cluster.db.execute(f"SELECT {SPEC.key}, SUM({SPEC.metric}) FROM {SPEC.store} GROUP BY 1 "
                                "ORDER BY 2 DESC, 1 LIMIT 3").fetchall()
    cells = [(f">{html.escape(player)}<", f">{points}<") for player, points in top]
    for _ in range(3):  # a busy machine can leave a chart still loading when the page is dumped: look again
        dom = subprocess.run([*args, "--dump-dom", login.as_uri()], capture_output=True, text=True, timeout=180)
        assert dom.returncode == 0, dom.stderr[-2000:]
        if all(p in dom.stdout and n in dom.stdout for p, n in cells):
            break
    for (player, points), (p, n) in zip(top, cells):
        assert p in dom.stdout and n in dom.stdout, (player, points, dom.stdout[-3000:])
    shot = tmp_path / "dashboard.png"
    done = subprocess.run([*args, f"--screenshot={shot}", login.as_uri()], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    img = Image.open(shot).convert("RGB")
    colours = dict((c, n) for n, c in img.getcolors(maxcolors=1 << 20))
    assert sum(colours.get(c, 0) for c in SERIES_COLOURS[:3]) > 2000, sorted(colours.items(), key=lambda kv: -kv[1])[:20]
    if os.environ.get("FEDERATOR_WRITE_SCREENSHOTS"):  # README's picture, made again on request only
        SCREENSHOT.parent.mkdir(exist_ok=True)
        shutil.copyfile(shot, SCREENSHOT)


# Superset's default categorical scheme's first colours (supersetColors)
SERIES_COLOURS = [(0x1F, 0xA8, 0xC9), (0x45, 0x4E, 0x7C), (0x5A, 0xC1, 0x89), (0xFF, 0x7F, 0x44)]
