"""SQLAlchemy's inspector over the Postgres port, the calls Superset makes for a dataset; run as
a script (``python pg_inspect.py URL``) under each SQLAlchemy the tests check: 2.x with psycopg 3
(the project's .venv) and 1.4 with psycopg2 (``sqla14_python``). Prints what it found as JSON.

Only SQLAlchemy here: the 1.4 venv has nothing else.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SQLA14_VENV = ROOT / ".venv-sqla14"  # ignored by git; made once, kept between runs
SQLA14_PINS = ("SQLAlchemy==1.4.54", "psycopg2-binary==2.9.13")


def sqla14_python() -> Path:
    """The Python of a venv with SQLAlchemy 1.4 and psycopg2, made when missing or pinned otherwise."""
    from tests.light_install import cached_venv  # here: this file also runs as a script in that venv

    return cached_venv(SQLA14_VENV, SQLA14_PINS)


def inspect(url: str) -> dict:
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    try:
        insp = sa.inspect(engine)
        pk = insp.get_pk_constraint("players", schema="public")
        found = {
            "version": sa.__version__,
            "schemas": [s for s in insp.get_schema_names() if s != "information_schema"],
            "default_schema": insp.default_schema_name,
            "tables": sorted(insp.get_table_names()),
            "public_tables": sorted(insp.get_table_names(schema="public")),
            "columns": [[c["name"], type(c["type"]).__name__, getattr(c["type"], "timezone", None), c["nullable"]]
                        for c in insp.get_columns("players", schema="public")],
            "pk": [pk["name"], pk["constrained_columns"]],
            "indexes": insp.get_indexes("players", schema="public"),
            "foreign_keys": insp.get_foreign_keys("players", schema="public"),
            "views": insp.get_view_names(schema="public"),
            "has_table": [insp.has_table("players", schema="public"), insp.has_table("players"),
                          insp.has_table("no_such_store", schema="public")],
        }
        with engine.connect() as conn:  # a dataset's query, its table qualified as Superset writes it
            found["rows"] = [list(r) for r in conn.execute(sa.text(
                "SELECT team, count(*) AS n FROM public.players GROUP BY team ORDER BY team NULLS FIRST"))]
        return found
    finally:
        engine.dispose()


if __name__ == "__main__":
    print(json.dumps(inspect(sys.argv[1])))
