"""A Superset engine spec for ``federator://`` databases (entry point ``superset.db_engine_specs``).

Imports without Superset (the base class is then a stand-in), so the entry point never
breaks an environment that has Federator but not Superset.

Time grains: the service has no DATE_TRUNC, so each grain truncates through functions it
does have: the timestamp's text (``2024-05-01 12:34:56+00``, always UTC) cut to the grain
and cast back. That covers second, minute, hour, day, month and year; week and quarter need
date arithmetic the service lacks and are left out. On window stores, ``window_start`` is
the natural time column: it is already on the window's grid, so grains at or above the
window size aggregate whole windows.
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


def _truncate(prefix_len: int, suffix: str) -> str:
    return f"CAST(SUBSTR(CAST({{col}} AS VARCHAR), 1, {prefix_len}) || '{suffix}' AS TIMESTAMP WITH TIME ZONE)"


TIME_GRAIN_EXPRESSIONS: dict[str | None, str] = {
    None: "{col}",
    "PT1S": _truncate(19, "+00"),
    "PT1M": _truncate(16, ":00+00"),
    "PT1H": _truncate(13, ":00:00+00"),
    "P1D": _truncate(10, " 00:00:00+00"),
    "P1M": _truncate(7, "-01 00:00:00+00"),
    "P1Y": _truncate(4, "-01-01 00:00:00+00"),
}


class FederatorEngineSpec(BaseEngineSpec):  # type: ignore[misc,valid-type]
    engine = "federator"
    engine_name = "Federator"
    engine_aliases = {"federator"}
    default_driver = "http"
    drivers = {"http": "HTTP", "https": "HTTPS"}
    sqlalchemy_uri_placeholder = "federator://host:port[?hosts=host2:port2,host3:port3&allow_stale=false]"

    # One store per query: no joins, no subqueries; Superset then applies its row limit
    # by rewriting LIMIT instead of wrapping the query.
    allows_joins = False
    allows_subqueries = False
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
