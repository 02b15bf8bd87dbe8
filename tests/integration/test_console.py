"""The console at / in a real browser: headless Chromium (Debian's package) loads each page from
a node of the shared three-node cluster, runs its scripts against the node's API, and the test
reads the DOM the scripts built and a screenshot of each page.

The module sorts beside test_dbapi.py, so both use one ``bi_cluster``.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import urllib.parse
from pathlib import Path

import pytest
import urllib3
from flask import Flask
from PIL import Image

from federator.http.console import register_console

from tests.http_server import running
from tests.integration.bi_cluster import P, bi_cluster  # noqa: F401 - bi_cluster is a fixture

HTTP = urllib3.PoolManager()
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is missing: make install puts it there")


def browse(url: str, *, screenshot: Path | None = None) -> str:
    """The page's DOM after its scripts ran (Chromium waits for the page's fetches within its
    virtual time budget), and a 1280x900 screenshot when asked."""
    args = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--no-first-run", "--hide-scrollbars", "--window-size=1280,900", "--virtual-time-budget=8000"]
    args += [f"--screenshot={screenshot}"] if screenshot else ["--dump-dom"]
    done = subprocess.run([*args, url], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def assert_not_blank(png: Path) -> None:
    """More than a blank page: many distinct colours, and ink (dark pixels) on it."""
    img = Image.open(png).convert("RGB")
    assert img.size == (1280, 900), img.size
    colours = img.getcolors(maxcolors=1 << 16)
    assert colours is None or len(colours) > 20, f"{png.name}: {len(colours or [])} colours"
    dark = sum(n for n, (r, g, b) in (colours or []) if r + g + b < 200) if colours else 1 << 20
    assert dark > 500, f"{png.name}: almost no text drawn ({dark} dark pixels)"


def sql_answer(endpoint: str, sql: str) -> dict:
    resp = HTTP.request("POST", f"http://{endpoint}/v1/sql", body=json.dumps({"sql": sql}),
                        headers={"Content-Type": "application/json"})
    assert resp.status == 200, resp.data[:300]
    return json.loads(resp.data)


def test_the_cluster_map_draws_each_partition_state(tmp_path) -> None:
    """Against a small app serving the console and a routing view made up here (no cluster: a
    partition without an active owner only lasts until a real cluster rebalances it)."""
    app = Flask("fake")
    register_console(app)
    nodes = [{"node_id": "a", "endpoint": "x:1", "state": "RUNNING", "last_heartbeat_ms": 0,
              "active": {"s": [0, 2]}, "standby": {"s": [1, 3]}, "restoring": {"s": [2]},
              "lags": {"s": {"1": 0, "2": 40, "3": 7}}},
             {"node_id": "b", "endpoint": "x:2", "state": "RUNNING", "last_heartbeat_ms": 0,
              "active": {"s": [3]}, "standby": {"s": [0]}, "restoring": {}, "lags": {"s": {"0": 0}}}]
    app.get("/v1/metadata")(lambda: {"node_id": "a", "application_id": "fake", "nodes": nodes,
                                     "stores": {"s": {"partitions": 4, "type": "kv", "topic": "t"}}})
    with running(app) as endpoint:
        dom = browse(f"http://{endpoint}/#cluster")
    states = dict(re.findall(r'data-partition="(\d)" data-state="(\w+)"', dom))
    # 0: active a, standby b in step; 1: only a standby; 2: active, restoring; 3: active b, its standby a lags
    assert states == {"0": "ok", "1": "uncovered", "2": "restoring", "3": "lagging"}, states
    assert "NO ACTIVE OWNER" in dom


def test_the_console_and_its_files_are_served(bi_cluster) -> None:
    endpoint = bi_cluster.cluster.nodes[0].endpoint
    page = HTTP.request("GET", f"http://{endpoint}/")
    assert page.status == 200 and page.headers["Content-Type"].startswith("text/html"), page.headers
    assert b"/console/console.js" in page.data
    for name, kind in (("console.js", "text/javascript"), ("console.css", "text/css")):
        resp = HTTP.request("GET", f"http://{endpoint}/console/{name}")
        assert resp.status == 200 and resp.headers["Content-Type"].startswith(kind), (name, resp.headers)
    missing = HTTP.request("GET", f"http://{endpoint}/console/..%2Fapp.py")
    assert missing.status == 404 and json.loads(missing.data)["error"]["code"] == "NOT_FOUND"


def test_a_query_runs_and_renders_as_the_api_answers(bi_cluster, tmp_path) -> None:
    endpoint = bi_cluster.cluster.nodes[1].endpoint
    sql = "SELECT player, team, games FROM players ORDER BY player"
    want = sql_answer(endpoint, sql)
    assert len(want["rows"]) > 50  # more than one page: the pager has work
    url = f"http://{endpoint}/#query?" + urllib.parse.urlencode({"sql": sql, "run": "1"})
    dom = browse(url)
    table = dom.split('id="result"', 1)[1].split("</table>", 1)[0]
    assert table.count("<tr>") == 1 + 50, table[:500]  # the header and the first page
    for row in want["rows"][:50]:  # each row of the first page as the API answered it, in order
        drawn = "".join('<td class="null">NULL</td>' if v is None else f"<td>{html.escape(str(v))}</td>" for v in row)
        assert f"<tr>{drawn}</tr>" in table, (row, table[:800])
    assert f"<td>{want['rows'][50][0]}</td>" not in table  # the next page's
    assert f"page 1 of {-(-len(want['rows']) // 50)}" in dom
    assert 'id="answer-token"' in dom and "partitions on" in dom  # the stats and the token
    browse(url, screenshot=tmp_path / "query.png")
    assert_not_blank(tmp_path / "query.png")


def test_a_query_error_is_shown_with_its_code(bi_cluster) -> None:
    endpoint = bi_cluster.cluster.nodes[0].endpoint
    dom = browse(f"http://{endpoint}/#query?" + urllib.parse.urlencode({"sql": "SELECT nope FROM players", "run": "1"}))
    assert 'class="error"' in dom and "UNKNOWN_COLUMN" in dom, dom[-2000:]


def test_explain_is_drawn_per_node(bi_cluster, tmp_path) -> None:
    endpoint = bi_cluster.cluster.nodes[0].endpoint
    sql = "SELECT team, COUNT(*) FROM players GROUP BY team"
    plan = sql_answer(endpoint, "EXPLAIN " + sql)
    nodes = {row[plan_column(plan, "node")] for row in plan["rows"]}
    url = f"http://{endpoint}/#query?" + urllib.parse.urlencode({"sql": sql, "explain": "1"})
    dom = browse(url)
    drawn = dom.split('id="plan"', 1)[1]
    assert drawn.count('class="owner"') == len(nodes) >= 2, drawn[:1000]
    for node in nodes:
        assert f"<h4>{node}</h4>" in drawn
    assert "partial aggregate" in drawn and 'class="receiver"' in drawn
    browse(url, screenshot=tmp_path / "explain.png")
    assert_not_blank(tmp_path / "explain.png")


def plan_column(answer: dict, name: str) -> int:
    return [c["name"] for c in answer["columns"]].index(name)


def test_the_store_browser_shows_definition_columns_and_sample_rows(bi_cluster, tmp_path) -> None:
    endpoint = bi_cluster.cluster.nodes[2].endpoint
    url = f"http://{endpoint}/#stores/players"
    dom = browse(url)
    for store in ("players", "blobs", "per_minute"):
        assert f'data-store="{store}"' in dom
    detail = dom.split('id="store-detail"', 1)[1]
    assert "<dt>key</dt>" in detail and "last_seen" in detail
    sample = detail.split('id="sample"', 1)[1].split("</table>", 1)[0]
    assert sample.count("<tr>") == 1 + 20, sample[:500]
    browse(url, screenshot=tmp_path / "stores.png")
    assert_not_blank(tmp_path / "stores.png")


def test_the_cluster_map_shows_every_partition_covered(bi_cluster, tmp_path) -> None:
    endpoint = bi_cluster.cluster.nodes[0].endpoint
    url = f"http://{endpoint}/#cluster"
    dom = browse(url)
    cells = dom.split('id="cluster-map"', 1)[1].split('id="cluster-nodes"', 1)[0]
    assert cells.count("data-partition=") == 3 * P, cells[:1000]
    assert 'data-state="uncovered"' not in cells
    assert cells.count("standby ") >= 3 * P  # one standby replica per partition
    nodes = dom.split('id="cluster-nodes"', 1)[1]
    for node in bi_cluster.cluster.nodes:
        assert f"<td>{node.node_id}</td>" in nodes
    browse(url, screenshot=tmp_path / "cluster.png")
    assert_not_blank(tmp_path / "cluster.png")
