"""A PEP 249 (DB-API 2.0) driver for Federator's ``POST /v1/sql``.

    import federator.dbapi
    conn = federator.dbapi.connect("http://node1:8080,node2:8080", timeout=10)
    cur = conn.cursor()
    cur.execute("SELECT player, total_score FROM player_stats WHERE player = ?", ["p0042"])
    cur.fetchall()             # Python rows
    cur.fetch_arrow_table()    # or the Arrow table the service sent

Answers come as Arrow IPC streams. The connection tries the listed nodes in turn when one
does not answer, and carries the consistency token of each answer into the next request,
so one connection's reads never go back in time.
"""

from __future__ import annotations

from federator.dbapi.connection import Connection
from federator.dbapi.cursor import Cursor
from federator.dbapi.errors import (
    DatabaseError,
    DataError,
    Error,
    IntegrityError,
    InterfaceError,
    InternalError,
    NotSupportedError,
    OperationalError,
    ProgrammingError,
    Warning,
)
from federator.dbapi.types import (
    BINARY,
    BOOLEAN,
    DATETIME,
    NUMBER,
    ROWID,
    STRING,
    Binary,
    Date,
    DateFromTicks,
    Time,
    TimeFromTicks,
    Timestamp,
    TimestampFromTicks,
)

apilevel = "2.0"
threadsafety = 2  # connections may be shared by threads (urllib3's pool is; the token has a lock); cursors not
paramstyle = "qmark"


def connect(url: str, *, timeout: float = 10.0, allow_stale: bool = False, max_lag: int | None = None,
            token: str | None = None, verify: bool | str = True, auth_token: str | None = None) -> Connection:
    """A connection to the nodes listed in ``url`` (``http[s]://host:port[,host2:port2...]``).

    ``timeout``: seconds per statement (the service's ``timeout_ms``); ``allow_stale``/``max_lag``:
    standby copies may answer when an active one cannot; ``token``: a consistency token to start
    from (e.g. a writer's, for read-your-writes); ``verify``: TLS certificate checking for https
    (False, or a CA bundle path); ``auth_token``: the bearer token of a user of the nodes'
    --users-file (default $FEDERATOR_AUTH_TOKEN).
    """
    return Connection(url, timeout=timeout, allow_stale=allow_stale, max_lag=max_lag, token=token, verify=verify,
                      auth_token=auth_token)


__all__ = [
    "BINARY", "BOOLEAN", "DATETIME", "NUMBER", "ROWID", "STRING", "Binary", "Connection", "Cursor", "DataError",
    "DatabaseError", "Date", "DateFromTicks", "Error", "IntegrityError", "InterfaceError", "InternalError",
    "NotSupportedError", "OperationalError", "ProgrammingError", "Time", "TimeFromTicks", "Timestamp",
    "TimestampFromTicks", "Warning", "apilevel", "connect", "paramstyle", "threadsafety",
]
