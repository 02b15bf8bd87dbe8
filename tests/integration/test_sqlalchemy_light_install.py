"""The client alone (`pip install federator`, no extras) where BI tools run: the repository's wheel in
a venv with Superset 6.1's ranges (SQLAlchemy 1.4, pyarrow 18, pandas 2.1, numpy < 2.3) and in one
with SQLAlchemy 2 and the newest pyarrow. In each, the DB-API driver, the SQLAlchemy dialect and
`federator sql` answer as DuckDB does over the same rows, nothing of the node comes along, and the
node's commands say which extra to install.

Named to run right after test_sqlalchemy.py, whose cluster it shares.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.integration.bi_cluster import BiCluster, bi_cluster  # noqa: F401 - a fixture
from tests.integration.light_probe import CORE_PLAYERS, DBAPI_PARAMS, DBAPI_SQL, SQLA_PARAMS, SQLA_SQL, rows
from tests.light_install import light_venv

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]  # the first run builds the venvs

PROBE = Path(__file__).with_name("light_probe.py")
VENVS = {
    "superset-6.1": ("SQLAlchemy==1.4.54", "pyarrow==18.1.0", "pandas==2.1.4", "numpy==1.26.4"),
    "sqlalchemy-2": ("SQLAlchemy>=2.0,<3", "pyarrow>=19"),
}
PLAYERS_COLUMNS = ["player", "team", "games", "score", "active", "last_seen", "rowtime"]


@pytest.fixture(scope="module", params=list(VENVS))
def light(request) -> Path:
    """The Python of the venv with the client alone."""
    return light_venv(request.param, VENVS[request.param])


def run(args: list, **kw) -> subprocess.CompletedProcess:
    # -I: nothing of the repository or the environment's PYTHON* settings on the venv's path
    return subprocess.run(args, capture_output=True, text=True, timeout=120, cwd="/", **kw)


def duck(c: BiCluster, sql: str, params=None) -> list[list]:
    return rows(c.db.execute(sql, params).fetchall())


def test_dbapi_and_sqlalchemy_answer_as_duckdb(bi_cluster, light) -> None:
    c = bi_cluster
    venv = light.parent.parent
    assert run([str(light), "-m", "pip", "check"]).returncode == 0
    done = run([str(light), "-I", str(PROBE), ",".join(n.endpoint for n in c.nodes)])
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout)
    assert Path(found["federator_file"]).is_relative_to(venv), found["federator_file"]  # the wheel, not the checkout
    assert found["importable"] == []
    assert found["superset_spec"] == {"federator": "FederatorEngineSpec"}
    sqla_1 = found["sqlalchemy"].startswith("1.4.")
    assert sqla_1 == (venv.name == ".venv-light-superset-6.1")

    assert found["dbapi"]["rows"] == duck(c, DBAPI_SQL, DBAPI_PARAMS) != []
    assert found["dbapi"]["description"][3] == ["score", "DOUBLE"]
    got = found["sqlalchemy_found"]
    assert got["schemas"] == ["main"] and got["tables"] == ["blobs", "per_minute", "players"]
    assert got["has_table"] == [True, False] and got["pk"] == ["player"]
    assert [col[0] for col in got["columns"]] == PLAYERS_COLUMNS and got["statements_asked_again"] == []
    types = {name: kind for name, kind, _ in got["columns"]}
    assert types == {"player": "String", "team": "String", "games": "BigInteger", "score": "Float" if sqla_1 else "Double",
                     "active": "Boolean", "last_seen": "DateTime", "rowtime": "DateTime"}
    assert [name for name, _, nullable in got["columns"] if not nullable] == ["player"]
    want = duck(c, SQLA_SQL.replace(":low", "$low"), SQLA_PARAMS)
    assert got["text_rows"] == want
    assert got.get("pandas_rows", want) == want and ("pandas_rows" in got) == sqla_1  # pandas beside Superset's ranges
    quoted = ", ".join(f"'{p}'" for p in CORE_PLAYERS)
    assert got["core_rows"] == duck(c, f"SELECT player, games FROM players WHERE player IN ({quoted}) "
                                       "ORDER BY player DESC LIMIT 2")


def test_the_command_runs_sql_and_names_the_extra_the_node_needs(bi_cluster, light) -> None:
    federator = str(light.parent / "federator")
    sql = "SELECT player, score FROM players WHERE score > ? ORDER BY score DESC, player LIMIT 5"
    done = run([federator, "sql", "--url", f"http://{bi_cluster.nodes[0].endpoint}", "--format", "json",
                "--param", "20", sql])
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["rows"] == duck(bi_cluster, sql, [20])
    for args, extra in ((["node", "--application-id", "a", "--state-dir", "/tmp/x"], "node"),
                        (["store", "list", "--application-id", "a"], "node"),
                        (["broker"], "broker"),
                        (["demo", "--exit"], "node,spark,broker"),
                        (["demo", "--bootstrap-servers", "kafka:9092"], "node,spark")):
        done = run([federator, *args])
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert f"install them with: pip install 'federator[{extra}]'" in done.stderr, done.stderr
