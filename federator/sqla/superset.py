"""A Superset engine spec for ``federator://`` databases (entry point ``superset.db_engine_specs``).

Imports without Superset (the base class is then a stand-in), so the entry point never
breaks an environment that has Federator but not Superset.

Time grains are every one Superset names, in DuckDB's functions (the engine the service runs):
DATE_TRUNC from second to year (a week starts on Monday, as in DuckDB), time_bucket for 5 s to
6 h, and weeks starting or ending on Sunday, Monday or Saturday. On window stores, ``window_start`` is the natural time
column: it is already on the window's grid, so grains at or above the window size
aggregate whole windows.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

try:
    from superset.db_engine_specs.base import BaseEngineSpec, LimitMethod
except ImportError:  # Superset not installed: keep the class importable and inspectable
    class BaseEngineSpec:  # type: ignore[no-redef]
        pass

    class LimitMethod:  # type: ignore[no-redef]
        FORCE_LIMIT = "force_limit"


TIME_GRAIN_EXPRESSIONS: dict[str | None, str] = {
    None: "{col}",
    **{grain: f"DATE_TRUNC('{unit}', {{col}})" for grain, unit in (
        ("PT1S", "second"), ("PT1M", "minute"), ("PT1H", "hour"), ("P1D", "day"), ("P1W", "week"),
        ("P1M", "month"), ("P3M", "quarter"), ("P1Y", "year"))},
    # buckets of a few seconds, minutes or hours: DuckDB's time_bucket, on UTC's grid
    **{grain: f"time_bucket(INTERVAL '{width}', {{col}})" for grain, width in (
        ("PT5S", "5 seconds"), ("PT30S", "30 seconds"), ("PT5M", "5 minutes"), ("PT10M", "10 minutes"),
        ("PT15M", "15 minutes"), ("PT30M", "30 minutes"), ("PT6H", "6 hours"))},
    # weeks named by their first or last day (DuckDB's weeks start on Monday)
    "1969-12-28T00:00:00Z/P1W": "DATE_TRUNC('week', {col} + INTERVAL 1 DAY) - INTERVAL 1 DAY",
    "1969-12-29T00:00:00Z/P1W": "DATE_TRUNC('week', {col})",
    "P1W/1970-01-03T00:00:00Z": "DATE_TRUNC('week', {col} + INTERVAL 1 DAY) + INTERVAL 5 DAY",
    "P1W/1970-01-04T00:00:00Z": "DATE_TRUNC('week', {col}) + INTERVAL 6 DAY",
}


class FederatorEngineSpec(BaseEngineSpec):  # type: ignore[misc,valid-type]
    engine = "federator"
    engine_name = "Federator"
    engine_aliases = {"federator"}
    default_driver = "http"
    drivers = {"http": "HTTP", "https": "HTTPS"}
    sqlalchemy_uri_placeholder = "federator://host:port[?hosts=host2:port2,host3:port3&allow_stale=false]"

    # The service runs any read statement in DuckDB: virtual datasets (subqueries) and joins.
    allows_joins = True
    allows_subqueries = True
    allows_alias_in_select = True
    allows_alias_in_orderby = True
    limit_method = LimitMethod.FORCE_LIMIT
    supports_dynamic_schema = False
    supports_catalog = False

    _time_grain_expressions = TIME_GRAIN_EXPRESSIONS

    @classmethod
    def convert_dttm(cls, target_type: str, dttm: dt.datetime, db_extra: dict[str, Any] | None = None) -> str | None:
        """A literal the service parses, for Superset's time filters."""
        t = target_type.upper()
        if t.startswith("TIMESTAMP"):
            return f"TIMESTAMP '{dttm.isoformat(sep=' ', timespec='microseconds')}'"
        if t == "DATE":
            return f"DATE '{dttm.date().isoformat()}'"
        return None
