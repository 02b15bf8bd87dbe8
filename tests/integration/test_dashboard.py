"""The Grafana dashboard (docs/grafana-dashboard.json) against what real nodes export.

No Grafana server installs from the package registries the project uses, so the dashboard is
checked, not loaded: every panel's PromQL (and the Node variable's query) may name only metrics
and labels that the nodes of the shared ``bi_cluster`` export on ``/metrics`` after answering
queries, and each legend only labels of the series it draws. The module sorts between
test_console.py and test_dbapi.py, so the three share one cluster.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import urllib3
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.bi_cluster import bi_cluster  # noqa: F401 - bi_cluster is a fixture
from tests.integration.test_sql import post

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana-dashboard.json"
TARGET_LABELS = {"instance", "job"}  # Prometheus adds these to every series it scrapes
_LABEL_LISTS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "atan2"}
_TOKEN = re.compile(r"""\s*(?:(?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')|(?P<range>\[[^\]]*\])
                        |(?P<number>\d+(?:\.\d*)?(?:[eE][+-]?\d+)?)|(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)
                        |(?P<op>=~|!~|[=!<>]=|[(){},=<>+\-*/%^]))""", re.X)


@dataclass
class Names:
    """What one PromQL expression names: each metric with the labels its matchers test, and the
    labels it groups or matches by."""

    metrics: dict[str, set[str]] = field(default_factory=dict)
    grouping: set[str] = field(default_factory=set)


def tokens(expr: str) -> list[tuple[str, str]]:
    out, at = [], 0
    while at < len(expr.rstrip()):
        m = _TOKEN.match(expr, at)
        assert m is not None and m.end() > at, f"PromQL that does not read at {expr[at:at + 30]!r}"
        out.append((m.lastgroup or "", m.group(m.lastgroup or 0)))
        at = m.end()
    return out


def promql_names(expr: str) -> Names:
    """Metric names are identifiers not followed by '(' (or by/without) that are no keyword; labels are the names
    in a selector's {...} and in by/without/on/ignoring/group_left/group_right (...)."""
    found, toks, i = Names(), tokens(expr), 0

    def following(j: int) -> str:
        return toks[j][1] if j < len(toks) else ""

    def names_until(j: int, close: str) -> tuple[list[str], int]:
        names = []
        while toks[j][1] != close:
            if toks[j][0] == "name" and following(j + 1) in ("=", "!=", "=~", "!~", ",", close):
                names.append(toks[j][1])
            j += 1
        return names, j + 1

    while i < len(toks):
        kind, text = toks[i]
        if kind == "name" and text.lower() in _LABEL_LISTS and following(i + 1) == "(":
            labels, i = names_until(i + 2, ")")
            found.grouping.update(labels)
            continue
        aggregation = following(i + 1).lower() in ("by", "without")  # sum by (x) (...)
        if kind == "name" and text.lower() not in _KEYWORDS and following(i + 1) != "(" and not aggregation:
            labels: list[str] = []
            if following(i + 1) == "{":
                labels, i = names_until(i + 2, "}")
            else:
                i += 1
            found.metrics.setdefault(text, set()).update(labels)
            continue
        i += 1
    return found


def test_the_promql_reader_finds_metrics_and_labels() -> None:
    names = promql_names('histogram_quantile(0.99, sum by (le, call) (rate(m_bucket{instance=~"$i", x!="a,b"}'
                         '[$__rate_interval]))) / clamp_min(n == 0 and on (a) k, 1e-9)')
    assert names.metrics == {"m_bucket": {"instance", "x"}, "n": set(), "k": set()}
    assert names.grouping == {"le", "call", "a"}


def _panels(panels: list[dict]):
    for p in panels:
        yield p
        yield from _panels(p.get("panels", []))


def _scrape(endpoint: str) -> dict[str, set[str]]:
    """Each sample name a node exports, with the label names it carries."""
    resp = urllib3.request("GET", f"http://{endpoint}/metrics", timeout=10)
    assert resp.status == 200
    names: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(resp.data.decode()):
        for sample in family.samples:
            names.setdefault(sample.name, set()).update(sample.labels)
    return names


def test_every_panel_names_only_what_the_nodes_export(bi_cluster) -> None:
    c = bi_cluster
    for sql in ("SELECT team, count(*) FROM players GROUP BY team", "SELECT * FROM players WHERE player = 'p007'",
                "SELECT count(*) FROM per_minute", "SELECT no_such_column FROM players"):
        for node in c.nodes:  # each node answers, and calls the others for their partitions
            post(node, {"sql": sql})
    exported: dict[str, set[str]] = {}
    for node in c.nodes:
        for name, labels in _scrape(node.endpoint).items():
            exported.setdefault(name, set()).update(labels)

    dashboard = json.loads(DASHBOARD.read_text())
    checked = []
    queries = [(f"panel {p.get('title')!r}", t["expr"], t.get("legendFormat", ""))
               for p in _panels(dashboard["panels"]) for t in p.get("targets", [])]
    for var in dashboard.get("templating", {}).get("list", []):
        m = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", str(var.get("definition", "")))
        if m:  # the variable's values: a label of a metric
            queries.append((f"variable {var['name']!r}", f"{m.group(1)}{{{m.group(2)}!=\"\"}}", ""))
    for where, expr, legend in queries:
        names = promql_names(expr)
        assert names.metrics, f"{where}: no metric in {expr!r}"
        for metric, labels in names.metrics.items():
            assert metric in exported, f"{where}: {metric} is not exported (the nodes export {sorted(exported)})"
            assert labels <= exported[metric] | TARGET_LABELS, \
                f"{where}: {metric} has no label {sorted(labels - exported[metric] - TARGET_LABELS)}"
        series_labels = set().union(*(exported[m] for m in names.metrics)) | TARGET_LABELS
        assert names.grouping <= series_labels, f"{where}: no label {sorted(names.grouping - series_labels)}"
        drawn = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", legend))
        assert drawn <= series_labels, f"{where}: its legend names {sorted(drawn - series_labels)}"
        checked.append(where)
    assert len(checked) == len(queries) > 20
