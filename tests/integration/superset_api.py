"""Superset's REST API as its web pages call it, and the one function that puts Federator into a
Superset: both databases, the datasets, two charts and a dashboard (the test and ``make superset``).
"""

from __future__ import annotations

import json
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

import urllib3


class SupersetError(AssertionError):
    pass


def rison(value: Any) -> str:
    """Rison, the encoding of Superset's ``?q=`` arguments (bools, numbers, strings, lists, dicts)."""
    if isinstance(value, bool):
        return "!t" if value else "!f"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return "'" + value.replace("!", "!!").replace("'", "!'") + "'"
    if isinstance(value, list):
        return "!(" + ",".join(rison(v) for v in value) + ")"
    return "(" + ",".join(f"{k}:{rison(v)}" for k, v in value.items()) + ")"


class SupersetApi:
    """Signed in as ``user`` with a bearer token (the instance takes no CSRF tokens: superset_config.py)."""

    def __init__(self, url: str, user: str, password: str) -> None:
        self.url = url
        self.http = urllib3.PoolManager(retries=False, timeout=urllib3.Timeout(connect=5, read=120))
        self.headers: dict[str, str] = {}
        login = self.call("POST", "/api/v1/security/login",
                          {"username": user, "password": password, "provider": "db", "refresh": False})
        self.headers["Authorization"] = f"Bearer {login['access_token']}"

    def call(self, method: str, path: str, body: Any = None, q: Any = None, ok: tuple[int, ...] = (200, 201)) -> Any:
        url = self.url + path + (f"?q={rison(q)}" if q is not None else "")
        resp = self.http.request(method, url, headers={**self.headers, "Content-Type": "application/json"},
                                 body=None if body is None else json.dumps(body))
        if resp.status not in ok:
            raise SupersetError(f"{method} {path}: {resp.status} {resp.data[:3000].decode(errors='replace')}")
        return json.loads(resp.data) if resp.data else None

    def get(self, path: str, q: Any = None, **query: str) -> Any:
        if query:
            path += "?" + urllib.parse.urlencode(query)
        return self.call("GET", path, q=q)

    def post(self, path: str, body: Any) -> Any:
        return self.call("POST", path, body)


@dataclass
class DemoSpec:
    """What to chart: a time series of ``SUM(metric)`` over ``store`` (a window store, by its
    ``time`` column), and a virtual dataset ``virtual_sql`` (a join) with ``series`` in it."""
    store: str
    key: str
    time: str
    metric: str
    virtual_name: str
    virtual_sql: str
    series: str
    grain: str = "PT15M"  # the dashboard's bar chart
    title: str = "Federator"


@dataclass
class Provisioned:
    databases: dict[str, int]  # "federator" / "postgresql" -> database id
    datasets: dict[tuple[str, str], int] = field(default_factory=dict)  # (database, "store"/"virtual") -> id
    charts: dict[str, int] = field(default_factory=dict)
    dashboard: int = 0
    dashboard_url: str = ""


def metric(column: str, label: str = "total") -> dict:
    return {"expressionType": "SIMPLE", "column": {"column_name": column}, "aggregate": "SUM", "label": label}


def add_database(api: SupersetApi, name: str, uri: str) -> int:
    """Tests the connection as the "Connect a database" dialog does, then adds it."""
    api.post("/api/v1/database/test_connection/", {"database_name": name, "sqlalchemy_uri": uri})
    return api.post("/api/v1/database/", {"database_name": name, "sqlalchemy_uri": uri, "expose_in_sqllab": True,
                                          "allow_run_async": False})["id"]


def add_dataset(api: SupersetApi, database: int, schema: str, table: str, sql: str | None = None) -> int:
    body = {"database": database, "schema": schema, "table_name": table, **({"sql": sql} if sql else {})}
    return api.post("/api/v1/dataset/", body)["id"]


def provision(api: SupersetApi, spec: DemoSpec, federator_uri: str, postgres_uri: str) -> Provisioned:
    """Both databases, a store's dataset and the virtual one on each, and a dashboard: a bar chart
    over ``federator://`` and a table over ``postgresql://``."""
    out = Provisioned({"federator": add_database(api, f"{spec.title} (federator://)", federator_uri),
                       "postgresql": add_database(api, f"{spec.title} (postgresql://)", postgres_uri)})
    for db, schema in (("federator", "main"), ("postgresql", "public")):
        out.datasets[(db, "store")] = add_dataset(api, out.databases[db], schema, spec.store)
        out.datasets[(db, "virtual")] = add_dataset(api, out.databases[db], schema, spec.virtual_name, spec.virtual_sql)
    bars = {"viz_type": "echarts_timeseries_bar", "x_axis": spec.time, "time_grain_sqla": spec.grain,
            "metrics": [metric(spec.metric)], "groupby": [spec.series], "adhoc_filters": [], "row_limit": 10000,
            "time_range": "No filter", "show_legend": True, "rich_tooltip": True}
    table = {"viz_type": "table", "query_mode": "aggregate", "groupby": [spec.key], "metrics": [metric(spec.metric)],
             "timeseries_limit_metric": metric(spec.metric), "order_desc": True, "row_limit": 10,
             "adhoc_filters": [], "time_range": "No filter", "server_pagination": False}
    out.charts["bars"] = add_chart(api, out.datasets[("federator", "virtual")],
                                   f"{spec.metric} by {spec.series} (federator://)", bars)
    out.charts["table"] = add_chart(api, out.datasets[("postgresql", "store")],
                                    f"Top {spec.key}s by {spec.metric} (postgresql://)", table)
    out.dashboard = add_dashboard(api, spec.title, [(out.charts["bars"], 7), (out.charts["table"], 5)])
    out.dashboard_url = f"{api.url}/superset/dashboard/{out.dashboard}/"
    return out


def add_chart(api: SupersetApi, dataset: int, name: str, form_data: dict) -> int:
    params = {**form_data, "datasource": f"{dataset}__table"}
    return api.post("/api/v1/chart/", {"slice_name": name, "viz_type": form_data["viz_type"], "datasource_id": dataset,
                                       "datasource_type": "table", "params": json.dumps(params)})["id"]


def add_dashboard(api: SupersetApi, title: str, charts: list[tuple[int, int]]) -> int:
    """A dashboard with ``charts`` (id, width out of 12) side by side in one row."""
    layout: dict[str, Any] = {
        "DASHBOARD_VERSION_KEY": "v2",
        "ROOT_ID": {"type": "ROOT", "id": "ROOT_ID", "children": ["GRID_ID"]},
        "GRID_ID": {"type": "GRID", "id": "GRID_ID", "children": ["ROW-1"], "parents": ["ROOT_ID"]},
        "HEADER_ID": {"type": "HEADER", "id": "HEADER_ID", "meta": {"text": title}},
        "ROW-1": {"type": "ROW", "id": "ROW-1", "children": [f"CHART-{c}" for c, _ in charts],
                  "parents": ["ROOT_ID", "GRID_ID"], "meta": {"background": "BACKGROUND_TRANSPARENT"}},
    }
    for chart, width in charts:
        layout[f"CHART-{chart}"] = {"type": "CHART", "id": f"CHART-{chart}", "children": [],
                                    "parents": ["ROOT_ID", "GRID_ID", "ROW-1"],
                                    "meta": {"chartId": chart, "width": width, "height": 60}}
    dashboard = api.post("/api/v1/dashboard/", {"dashboard_title": title, "published": True,
                                                "position_json": json.dumps(layout)})["id"]
    for chart, _ in charts:  # a chart belongs to a dashboard through the chart
        api.call("PUT", f"/api/v1/chart/{chart}", {"dashboards": [dashboard]})
    return dashboard
