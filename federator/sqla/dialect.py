"""A SQLAlchemy dialect for Federator over the DB-API driver (federator.dbapi).

URLs: ``federator://host:port`` (HTTP; ``federator+http://`` is the same) and
``federator+https://host:port``. Query-string options: ``hosts=h2:p2,h3:p3`` (more nodes
to try when the first does not answer; SQLAlchemy URLs hold one host), ``timeout`` (seconds),
``allow_stale`` (true/false), ``max_lag`` (records), ``token`` (a consistency token to start
from), ``verify`` (https: false, or a CA bundle path).

Reflection reads ``information_schema`` and ``DESCRIBE``. Stores live in one schema, ``main``.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import sqlalchemy
from sqlalchemy import types as sqltypes
from sqlalchemy.engine import default, reflection
from sqlalchemy.engine.url import URL
from sqlalchemy.sql import compiler

from federator.sqla.types import FederatorDate, FederatorDateTime, FederatorTypeCompiler, resolve_type

SCHEMA = "main"
_SQLALCHEMY_1 = sqlalchemy.__version__.startswith("1.")


def _cache(fn: Any) -> Any:
    """SQLAlchemy's reflection cache (one per Inspector: a dataset editor's repeated calls ask the
    node once). 1.4's decorator copies the method's signature into generated code, which breaks
    on string annotations, so there it wraps an unannotated stand-in of the same name."""
    if not _SQLALCHEMY_1:
        return reflection.cache(fn)

    def unannotated(self, connection, *args, **kw):
        return fn(self, connection, *args, **kw)

    unannotated.__name__ = fn.__name__  # the cache's key
    return reflection.cache(unannotated)


class FederatorCompiler(compiler.SQLCompiler):
    def limit_clause(self, select: Any, **kw: Any) -> str:
        # The default writes "LIMIT -1 OFFSET n" for an OFFSET alone; the service (like
        # DuckDB) takes OFFSET without LIMIT. Bound LIMIT/OFFSET values are accepted.
        text = ""
        if select._limit_clause is not None:
            text += "\n LIMIT " + self.process(select._limit_clause, **kw)
        if select._offset_clause is not None:
            text += "\n OFFSET " + self.process(select._offset_clause, **kw)
        return text


class FederatorDialect(default.DefaultDialect):
    name = "federator"
    driver = "http"
    scheme = "http"

    supports_statement_cache = True
    default_paramstyle = "qmark"
    supports_native_boolean = True
    supports_native_decimal = False
    supports_alter = False
    supports_sequences = False
    supports_default_values = False
    supports_empty_insert = False
    supports_multivalues_insert = False
    supports_is_distinct_from = False
    supports_server_side_cursors = False
    postfetch_lastrowid = False
    returns_native_bytes = True
    max_identifier_length = 200  # store names: [A-Za-z_][A-Za-z0-9_]{0,199}

    statement_compiler = FederatorCompiler
    type_compiler_cls = FederatorTypeCompiler
    type_compiler = FederatorTypeCompiler  # SQLAlchemy 1.4's name for the same
    colspecs = {sqltypes.DateTime: FederatorDateTime, sqltypes.Date: FederatorDate}

    @classmethod
    def import_dbapi(cls) -> ModuleType:
        import federator.dbapi

        return federator.dbapi

    if _SQLALCHEMY_1:
        # SQLAlchemy 1.4 (which Superset pins) calls dbapi(); 2.x warns if it is defined.
        @classmethod
        def dbapi(cls) -> ModuleType:  # type: ignore[override]
            return cls.import_dbapi()

    def create_connect_args(self, url: URL) -> tuple[list[Any], dict[str, Any]]:
        opts = dict(url.query)
        nodes = [f"{url.host or '127.0.0.1'}:{url.port or 8080}"]
        extra = opts.pop("hosts", "")
        if isinstance(extra, tuple):  # ?hosts=a&hosts=b
            extra = ",".join(extra)
        nodes += [h for h in extra.split(",") if h.strip()]
        kwargs: dict[str, Any] = {}
        if "timeout" in opts:
            kwargs["timeout"] = float(opts.pop("timeout"))
        if "allow_stale" in opts:
            kwargs["allow_stale"] = _flag(opts.pop("allow_stale"), "allow_stale")
        if "max_lag" in opts:
            kwargs["max_lag"] = int(opts.pop("max_lag"))
        if "token" in opts:
            kwargs["token"] = opts.pop("token")
        if url.password:  # federator://:TOKEN@host:port (or user:TOKEN@): the bearer token, as BI tools send a password
            kwargs["auth_token"] = url.password
        if "auth_token" in opts:
            kwargs["auth_token"] = opts.pop("auth_token")
        if "verify" in opts:
            v = opts.pop("verify")
            kwargs["verify"] = v if v.lower() not in ("false", "0", "no", "true", "1", "yes") else _flag(v, "verify")
        if opts:
            raise ValueError(f"unknown federator URL option(s) {sorted(opts)}; "
                             "known: hosts, timeout, allow_stale, max_lag, token, auth_token, verify")
        path = f"/{url.database}" if url.database else ""
        return [f"{self.scheme}://" + ",".join(nodes) + path], kwargs

    # ---- no transactions: the service only reads -----------------------------------------

    def do_rollback(self, dbapi_connection: Any) -> None:
        pass  # the pool "resets" connections with a rollback; there is nothing to undo

    def do_commit(self, dbapi_connection: Any) -> None:
        pass

    def get_isolation_level(self, dbapi_connection: Any) -> str:
        return "AUTOCOMMIT"

    def get_isolation_level_values(self, dbapi_connection: Any) -> list[str]:
        return ["AUTOCOMMIT"]

    def set_isolation_level(self, dbapi_connection: Any, level: str) -> None:
        if level != "AUTOCOMMIT":
            raise NotImplementedError(f"Federator reads only; isolation level {level!r} does not apply")

    def _get_default_schema_name(self, connection: Any) -> str:
        return SCHEMA

    def _get_server_version_info(self, connection: Any) -> None:
        return None

    # ---- reflection -------------------------------------------------------------------------

    def _rows(self, connection: Any, sql: str, params: tuple = ()) -> list[tuple]:
        return list(connection.exec_driver_sql(sql, params).fetchall())

    @_cache
    def get_schema_names(self, connection: Any, **kw: Any) -> list[str]:
        return [SCHEMA]

    @_cache
    def get_table_names(self, connection: Any, schema: str | None = None, **kw: Any) -> list[str]:
        return [r[0] for r in self._rows(
            connection, "SELECT table_name FROM information_schema.tables WHERE table_schema = ? ORDER BY table_name",
            (schema or SCHEMA,))]

    def get_view_names(self, connection: Any, schema: str | None = None, **kw: Any) -> list[str]:
        return []

    def has_table(self, connection: Any, table_name: str, schema: str | None = None, **kw: Any) -> bool:
        return bool(self._rows(
            connection, "SELECT table_name FROM information_schema.tables WHERE table_schema = ? AND table_name = ?",
            (schema or SCHEMA, table_name)))

    @_cache
    def get_columns(self, connection: Any, table_name: str, schema: str | None = None, **kw: Any) -> list[dict]:
        rows = self._rows(
            connection,
            "SELECT column_name, data_type, is_nullable FROM information_schema.columns "
            "WHERE table_schema = ? AND table_name = ? ORDER BY ordinal_position",
            (schema or SCHEMA, table_name))
        if not rows:
            from sqlalchemy.exc import NoSuchTableError

            raise NoSuchTableError(table_name)
        return [{"name": name, "type": resolve_type(type_name), "nullable": nullable == "YES", "default": None,
                 "autoincrement": False, "comment": None} for name, type_name, nullable in rows]

    @_cache
    def get_pk_constraint(self, connection: Any, table_name: str, schema: str | None = None, **kw: Any) -> dict:
        # DESCRIBE marks the store's key column PRI; every store has exactly one.
        quoted = self.identifier_preparer.quote_identifier(table_name)
        keys = [r[0] for r in self._rows(connection, f"DESCRIBE {quoted}") if r[3] == "PRI"]
        return {"constrained_columns": keys, "name": None}

    def get_foreign_keys(self, connection: Any, table_name: str, schema: str | None = None, **kw: Any) -> list:
        return []

    def get_indexes(self, connection: Any, table_name: str, schema: str | None = None, **kw: Any) -> list:
        return []

    def get_unique_constraints(self, connection: Any, table_name: str, schema: str | None = None, **kw: Any) -> list:
        return []

    def get_check_constraints(self, connection: Any, table_name: str, schema: str | None = None, **kw: Any) -> list:
        return []

    @_cache
    def get_table_comment(self, connection: Any, table_name: str, schema: str | None = None, **kw: Any) -> dict:
        rows = self._rows(
            connection, "SELECT store_type, partitions FROM information_schema.tables "
            "WHERE table_schema = ? AND table_name = ?", (schema or SCHEMA, table_name))
        return {"text": f"{rows[0][0]} store, {rows[0][1]} partitions" if rows else None}


class FederatorHTTPSDialect(FederatorDialect):
    driver = "https"
    scheme = "https"


def _flag(value: str, name: str) -> bool:
    v = str(value).strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"URL option {name} must be true or false, got {value!r}")

