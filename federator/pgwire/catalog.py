"""The Postgres catalog tools read on connect, answered by DuckDB over the stores' shapes.

BI tools and drivers learn what exists from ``pg_catalog`` and ``information_schema``
(pgjdbc's DatabaseMetaData, psql's ``\\d``, DBeaver's navigator). DuckDB ships both as views
for this purpose; here each store is an empty DuckDB table of its columns with its key as the
primary key, in a database named ``federator``, schema ``public`` (where Postgres tools look).
These tables give the catalog the stores' shapes; their rows are never an answer (a statement
that reads a store reads it from the store, federator/pgwire/names.py). Two of DuckDB's views
are fixed in a schema of our own: ``pg_attribute`` gives DuckDB's internal type ids where
Postgres has type OIDs, and ``pg_type`` lacks ``text``;
``format_type`` is DuckDB's macro over those ids. ``_TABLES`` and ``_FUNCTIONS`` say what a
statement's references are rewritten to.

The database is sandboxed like the engine's (no files, no extensions, settings locked) and
rebuilt when the stores change.
"""

from __future__ import annotations

import re
import threading
from typing import Any, Callable

import duckdb
import pyarrow as pa
import sqlglot
from sqlglot import exp

from federator.cancel import Cancel
from federator.catalog.definition import StoreDefinition
from federator.errors import SqlError
from federator.owner.duck import sql_error
from federator.pgwire import types as pgt
from federator.pgwire.names import CATALOG_SCHEMAS, point_at, relations
from federator.sql.types import sql_type_name

FIX = "pg_fix"  # our schema of fixed catalog views
STORES = "public"  # the schema of the stores' tables, Postgres's default
SERVER_VERSION = "16.0"  # what drivers parse to choose their catalog queries
PG_CATALOG_OID = 11  # Postgres's OID of the pg_catalog schema, home of the types and functions
_ANYELEMENT = 2283  # Postgres's pseudo-type of a generic function's result

# Columns Postgres's catalog has and DuckDB's views lack, which psql, pgjdbc and SQLAlchemy read
_EXTRA_COLUMNS: dict[str, dict[str, str]] = {
    "pg_class": {"relforcerowsecurity": "false", "relhasoids": "false", "relpartbound": "NULL::VARCHAR"},
    "pg_database": {"encoding": "6", "datcollate": "'C'", "datctype": "'C'", "datdba": "10", "datacl": "NULL::VARCHAR",
                    "dattablespace": "0", "datconnlimit": "-1", "datlocprovider": "'c'", "daticulocale": "NULL::VARCHAR"},
    "pg_namespace": {},
    "pg_constraint": {"conperiod": "false"},
    "pg_collation": {"collnamespace": "0"},
    "pg_proc": {},
}
# Array columns DuckDB's views type as NULL, which tools unnest or concatenate (pgcli's \d+)
_ARRAY_COLUMNS = {"pg_class": ("reloptions", "relacl")}
# Catalog tables DuckDB does not have, as empty tables (nothing of theirs exists here)
_EMPTY: dict[str, str] = {
    "pg_roles": "rolname VARCHAR, oid INTEGER, rolsuper BOOLEAN, rolcanlogin BOOLEAN, rolinherit BOOLEAN, "
                "rolcreaterole BOOLEAN, rolcreatedb BOOLEAN, rolreplication BOOLEAN, rolconnlimit INTEGER, "
                "rolvaliduntil TIMESTAMPTZ, rolbypassrls BOOLEAN, rolconfig VARCHAR[]",
    "pg_user": "usename VARCHAR, usesysid INTEGER, usecreatedb BOOLEAN, usesuper BOOLEAN",
    "pg_inherits": "inhrelid INTEGER, inhparent INTEGER, inhseqno INTEGER, inhdetachpending BOOLEAN",
    "pg_trigger": "oid INTEGER, tgrelid INTEGER, tgname VARCHAR, tgfoid INTEGER, tgtype SMALLINT, tgenabled VARCHAR, "
                  "tgisinternal BOOLEAN, tgconstraint INTEGER, tgparentid INTEGER",
    "pg_policy": "oid INTEGER, polname VARCHAR, polrelid INTEGER, polcmd VARCHAR, polpermissive BOOLEAN, "
                 "polroles INTEGER[], polqual VARCHAR, polwithcheck VARCHAR",
    "pg_statistic_ext": "oid INTEGER, stxrelid INTEGER, stxname VARCHAR, stxnamespace INTEGER, stxowner INTEGER, "
                        "stxkeys SMALLINT[], stxkind VARCHAR[], stxstattarget INTEGER",
    "pg_publication": "oid INTEGER, pubname VARCHAR, puballtables BOOLEAN, pubinsert BOOLEAN, pubupdate BOOLEAN, "
                      "pubdelete BOOLEAN, pubtruncate BOOLEAN, pubviaroot BOOLEAN",
    "pg_publication_rel": "oid INTEGER, prpubid INTEGER, prrelid INTEGER, prqual VARCHAR, prattrs SMALLINT[]",
    "pg_publication_namespace": "oid INTEGER, pnpubid INTEGER, pnnspid INTEGER",
    "pg_extension": "oid INTEGER, extname VARCHAR, extowner INTEGER, extnamespace INTEGER, extversion VARCHAR",
    "pg_foreign_table": "ftrelid INTEGER, ftserver INTEGER, ftoptions VARCHAR[]",
    "pg_foreign_server": "oid INTEGER, srvname VARCHAR",
    "pg_matviews": "schemaname VARCHAR, matviewname VARCHAR, matviewowner VARCHAR, definition VARCHAR",
    "pg_range": "rngtypid INTEGER, rngsubtype INTEGER",
    "pg_rewrite": "oid INTEGER, rulename VARCHAR, ev_class INTEGER",
    "pg_stat_activity": "datid INTEGER, datname VARCHAR, pid INTEGER, usename VARCHAR, application_name VARCHAR, "
                        "state VARCHAR, query VARCHAR",
    "pg_partitioned_table": "partrelid INTEGER, partstrat VARCHAR, partnatts SMALLINT",
    "pg_event_trigger": "oid INTEGER, evtname VARCHAR",
    "pg_auth_members": "roleid INTEGER, member INTEGER, grantor INTEGER, admin_option BOOLEAN",
    "pg_shdescription": "objoid INTEGER, classoid INTEGER, description VARCHAR",
    "pg_language": "oid INTEGER, lanname VARCHAR",
    "pg_opclass": "oid INTEGER, opcname VARCHAR, opcmethod INTEGER, opcnamespace INTEGER, opcdefault BOOLEAN",
    "pg_operator": "oid INTEGER, oprname VARCHAR, oprnamespace INTEGER, oprleft INTEGER, oprright INTEGER, oprresult INTEGER",
    "pg_cast": "oid INTEGER, castsource INTEGER, casttarget INTEGER, castfunc INTEGER, castcontext VARCHAR",
    "pg_aggregate": "aggfnoid INTEGER, aggkind VARCHAR",
    "pg_conversion": "oid INTEGER, conname VARCHAR",
    "pg_seclabel": "objoid INTEGER, classoid INTEGER, objsubid INTEGER, provider VARCHAR, label VARCHAR",
}
# catalog relations read from FIX instead of DuckDB's pg_catalog
_TABLES = {"pg_attribute", "pg_type", "pg_index", *_EXTRA_COLUMNS, *_EMPTY}
# Postgres catalog functions of a session: name -> the value given the session's settings
_SESSION_FUNCTIONS = {"version", "current_setting", "pg_backend_pid", "current_user", "session_user",
                      "current_schema", "current_schemas", "current_database", "current_catalog", "user"}
# catalog functions answered by a macro of FIX
_MACROS = {  # name -> (parameters, body): Postgres catalog functions DuckDB lacks, as tools call them
    "pg_get_userbyid": ("role_oid", "'federator'"),
    "pg_encoding_to_char": ("encoding", "'UTF8'"),
    "pg_is_in_recovery": ("", "false"),
    "pg_total_relation_size": ("rel", "0::BIGINT"),
    "pg_relation_size": ("rel, fork := 'main'", "0::BIGINT"),
    "pg_tablespace_location": ("tablespace_oid", "''"),
    "pg_get_serial_sequence": ("tab, col", "NULL"),
    "pg_get_partkeydef": ("rel", "NULL"),
    # an OID as text, or a name (its schema and quotes dropped: the stores are in one schema)
    "to_regclass": ("name", "coalesce(TRY_CAST(name AS INTEGER), (SELECT oid FROM pg_catalog.pg_class "
                            """WHERE relname = regexp_extract(name::VARCHAR, '([^."]+)"?$', 1) LIMIT 1))"""),
    "to_regtype": ("name", f"coalesce(TRY_CAST(name AS INTEGER), (SELECT oid FROM {FIX}.pg_type WHERE typname = "
                           """regexp_extract(name::VARCHAR, '([^."]+)"?$', 1) LIMIT 1))"""),
    "pg_get_statisticsobjdef_columns": ("oid", "NULL"),
    "pg_get_expr": ("expr, rel, pretty := false", "expr"),
    "pg_relation_is_publishable": ("rel", "false"),
    "array_upper": ("arr, dim", "len(arr)"),
    "array_lower": ("arr, dim", "1"),
    "_pg_expandarray": ("arr", "unnest(list_transform(generate_series(1, len(arr)), lambda i: {'x': arr[i], 'n': i}))"),
    "quote_ident": ("name", """CASE WHEN regexp_full_match(name, '[a-z_][a-z0-9_$]*') THEN name """
                            """ELSE '"' || replace(name, '"', '""') || '"' END"""),
    "pg_get_function_result": ("oid", "NULL"),
    "pg_get_function_arguments": ("oid", "NULL"),
    "pg_get_triggerdef": ("oid, pretty := false", "NULL"),
    "pg_get_ruledef": ("oid, pretty := false", "NULL"),
}
# catalog functions answered by looking their first argument up in a table of FIX: name -> (table, key,
# value, the value when the second argument is a column's number: pg_get_indexdef(index, column, pretty))
_LOOKUPS = {"pg_get_indexdef": ("index_definitions", "indexrelid", "indexdef", "keydef")}
# Postgres functions DuckDB has under another name
_RENAMED = {"json_build_object": "json_object"}
_FUNCTIONS = {"format_type", *_MACROS}

# psql spells some operators as OPERATOR(pg_catalog.~) and some collations as pg_catalog.default,
# neither of which sqlglot or DuckDB reads
_OPERATOR = re.compile(r"OPERATOR\s*\(\s*pg_catalog\s*\.\s*([~!<>=*+\-/^|&#@]+)\s*\)", re.I)
_COLLATE = re.compile(r"\s+COLLATE\s+(?:pg_catalog\s*\.\s*)?\"?(?:default|C|POSIX)\"?", re.I)


# ::regtype[] (pgcli's function list), which sqlglot does not read: the catalog's lists of argument
# types (pg_proc's) hold DuckDB's type names already
_OBJECT_ARRAY = re.compile(r"::\s*(?:pg_catalog\s*\.\s*)?regtype\s*\[\s*\]", re.I)


def plain_sql(sql: str) -> str:
    return _OBJECT_ARRAY.sub("::VARCHAR[]", _COLLATE.sub("", _OPERATOR.sub(r"\1", sql)))


def _column_oid(t: pa.DataType) -> int:
    return pgt.oid_of(t)


class PgCatalog:
    """One DuckDB database holding the stores' shapes and the fixed catalog views."""

    def __init__(self, stores: Callable[[], dict[str, StoreDefinition]]) -> None:
        self._stores = stores
        self._lock = threading.Lock()
        self._built_for: tuple | None = None
        self._db: duckdb.DuckDBPyConnection | None = None

    def cursor(self) -> duckdb.DuckDBPyConnection:
        stores = self._stores()
        fingerprint = tuple(sorted((n, tuple(str(f) for f in d.arrow_schema()), d.key_name) for n, d in stores.items()))
        with self._lock:
            if self._db is None or fingerprint != self._built_for:
                self._db = _build(stores)
                self._built_for = fingerprint
            cur = self._db.cursor()
        cur.execute("USE federator")  # a cursor starts in DuckDB's own database
        return cur

    def describe(self, tree: exp.Expression) -> tuple[list[int], pa.Schema]:
        """The parameter OIDs and the answer's columns of a statement (rewritten), without running it.

        DuckDB 2.0 reports a prepared statement's parameters as UNKNOWN, so a parameter takes the
        type of what it is compared with (sqlglot's type annotation over the stores' columns), and
        the answer's columns are DuckDB's binding of the statement with each parameter a typed NULL."""
        stores = self._stores()
        named = _stores_named(tree, stores, qualified=False)
        types = _parameter_types(named, stores, len(_parameters(named)))
        bound = _stores_named(tree, stores, qualified=True)  # the stores' empty tables, for their columns' types
        params = _parameters(bound)
        for node in params:
            index = _parameter_index(node, params)
            node.replace(exp.cast(exp.Null(), types[index] if index < len(types) else "VARCHAR"))
        cur = self.cursor()
        try:
            rel = cur.sql(bound.sql(dialect="duckdb"))
            names, duck_types = rel.columns, [str(t) for t in rel.types]
        except duckdb.Error as e:
            raise sql_error(e) from None
        oids = [_oid_of_duck(t) for t in types]
        return oids, pa.schema([pa.field(n, _arrow_of_duck(t)) for n, t in zip(names, duck_types)])

    def run(self, sql: str, parameters: list[Any], timeout_s: float, cancel: Cancel | None = None,
            relations: dict[str, pa.Table] | None = None) -> pa.Table:
        """``sql``'s answer; ``relations``: tables it reads besides the catalog (stores' rows)."""
        cur = self.cursor()
        for name, table in (relations or {}).items():
            cur.register(name, table)
        timer = threading.Timer(timeout_s, cur.interrupt)
        timer.start()
        forget = cancel.on_cancel(cur.interrupt) if cancel is not None else (lambda: None)
        try:
            return cur.sql(sql, params=parameters or None).to_arrow_table()
        except duckdb.Error as e:
            raise sql_error(e) from None
        finally:
            timer.cancel()
            forget()


def _stores_named(tree: exp.Expression, stores: dict[str, StoreDefinition], qualified: bool) -> exp.Expression:
    """A copy of ``tree`` (rewritten) whose store references name the stores as they are defined:
    bare, or ``qualified`` as the catalog database's tables of them."""
    copy = tree.copy()
    tables = relations(copy, stores, CATALOG_SCHEMAS | {FIX})[0]
    known = {n.lower(): n for n in stores}
    point_at(copy, tables, [exp.Table(this=exp.to_identifier(known.get(t.name.lower(), t.name), quoted=True),
                                      db=exp.to_identifier(STORES) if qualified else None,
                                      catalog=exp.to_identifier("federator") if qualified else None) for t in tables])
    return copy


def _build(stores: dict[str, StoreDefinition]) -> duckdb.DuckDBPyConnection:
    db = duckdb.connect(":memory:", config={"enable_external_access": False, "autoload_known_extensions": False,
                                            "autoinstall_known_extensions": False, "threads": 1})
    db.execute("ATTACH ':memory:' AS federator")
    db.execute("USE federator")
    db.execute(f"CREATE SCHEMA {STORES}")
    db.execute("SET TimeZone = 'UTC'")
    fixes: list[tuple[str, str, int, int, bool]] = []  # table, column, type OID, typmod, is the key
    for name, defn in sorted(stores.items()):
        cols = []
        for f in defn.arrow_schema():
            key = " PRIMARY KEY" if f.name == defn.key_name else ""
            cols.append(f'"{_ident(f.name)}" {sql_type_name(f.type)}{key}')
            typmod = (f.type.precision * 65536 + f.type.scale + 4) if pa.types.is_decimal(f.type) else -1
            fixes.append((name, f.name, _column_oid(f.type), typmod, f.name == defn.key_name))
        db.execute(f'CREATE TABLE {STORES}."{_ident(name)}" ({", ".join(cols)})')
    db.execute(f"CREATE SCHEMA {FIX}")
    db.execute(f"CREATE TABLE {FIX}.column_types (relname VARCHAR, attname VARCHAR, oid INTEGER, typmod INTEGER, "
               "is_key BOOLEAN)")
    if fixes:
        db.executemany(f"INSERT INTO {FIX}.column_types VALUES (?, ?, ?, ?, ?)", fixes)
    # Postgres's types as drivers know them, in pg_catalog: DuckDB's, and the ones it lacks
    db.execute(f"""CREATE TABLE {FIX}.pg_type AS
        SELECT * REPLACE ({PG_CATALOG_OID} AS typnamespace,  -- DuckDB gives its own sizes of variable-length types
                          CASE WHEN typname IN ('varchar', 'bytea', 'bit', 'numeric') THEN -1 ELSE typlen END AS typlen,
                          0::INTEGER AS typrelid)  -- no type is a table's row type (pgjdbc's getTypeInfo asks)
        FROM pg_catalog.pg_type WHERE oid IS NOT NULL
        UNION ALL BY NAME SELECT 25::INTEGER AS oid, 'text' AS typname, -1 AS typlen, 'b' AS typtype, 'S' AS typcategory,
            {PG_CATALOG_OID} AS typnamespace, 0 AS typowner, false AS typbyval, true AS typisdefined, 0 AS typrelid
        UNION ALL BY NAME SELECT * FROM (VALUES (114, 'json', -1, 'b', 'U', false),
            ({_ANYELEMENT}, 'anyelement', 4, 'p', 'P', true), (2279, 'trigger', 4, 'p', 'P', true))
            AS t(oid, typname, typlen, typtype, typcategory, typbyval),
            (SELECT {PG_CATALOG_OID} AS typnamespace, 0 AS typowner, true AS typisdefined, 0 AS typrelid)""")
    db.execute(f"""CREATE VIEW {FIX}.pg_attribute AS
        SELECT a.* REPLACE (coalesce(t.oid, 1043) AS atttypid, coalesce(t.typmod, -1) AS atttypmod,
                            coalesce((SELECT typlen FROM {FIX}.pg_type p WHERE p.oid = t.oid), -1) AS attlen,
                            -- Postgres's storage: plain for fixed-size types, extended for the others (\\d+ shows it)
                            CASE WHEN coalesce((SELECT typlen FROM {FIX}.pg_type p WHERE p.oid = t.oid), -1) > 0
                                 THEN 'p' ELSE 'x' END AS attstorage)
        FROM pg_catalog.pg_attribute a
        JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
        LEFT JOIN {FIX}.column_types t ON t.relname = c.relname AND t.attname = a.attname""")
    db.execute(f"""CREATE MACRO {FIX}.format_type(type_oid, typemod) AS
        CASE WHEN type_oid = 1700 AND typemod > 4
             THEN 'numeric(' || ((typemod - 4) // 65536) || ',' || ((typemod - 4) % 65536) || ')'
             ELSE (SELECT CASE typname WHEN 'int8' THEN 'bigint' WHEN 'int4' THEN 'integer' WHEN 'int2' THEN 'smallint'
                  WHEN 'float8' THEN 'double precision' WHEN 'float4' THEN 'real' WHEN 'bool' THEN 'boolean'
                  WHEN 'varchar' THEN 'character varying' WHEN 'timestamptz' THEN 'timestamp with time zone'
                  WHEN 'timestamp' THEN 'timestamp without time zone' ELSE typname END
                  FROM {FIX}.pg_type WHERE oid = type_oid) END""")
    # neither FIX nor DuckDB's default schema (empty: the stores are in STORES) is shown, and no
    # database but federator (DuckDB's system views, temp and memory are not the server's)
    not_hidden = f"IN (SELECT oid FROM duckdb_schemas() WHERE schema_name NOT IN ('{FIX}', 'main') AND " \
                 "database_name = 'federator')"
    shown = {"pg_class": f"relnamespace {not_hidden}", "pg_namespace": f"oid {not_hidden}",
             "pg_database": "datname = 'federator'"}
    for name, extra in _EXTRA_COLUMNS.items():
        added = "".join(f", {value} AS {column}" for column, value in extra.items())
        where = f" WHERE {shown[name]}" if name in shown else ""
        arrays = ", ".join(f"NULL::VARCHAR[] AS {column}" for column in _ARRAY_COLUMNS.get(name, ()))
        star = f"* REPLACE ({arrays})" if arrays else "*"
        db.execute(f"CREATE VIEW {FIX}.{name} AS SELECT {star}{added} FROM pg_catalog.{name}{where}")
    for name, columns in _EMPTY.items():
        db.execute(f"CREATE TABLE {FIX}.{name} ({columns})")
    db.execute(f"""CREATE VIEW {FIX}.information_schema_columns AS
        SELECT c.* REPLACE (coalesce(regexp_replace({FIX}.format_type(t.oid, -1), '\\(.*', ''), lower(c.data_type))
                                AS data_type,
                            coalesce((SELECT typname FROM {FIX}.pg_type p WHERE p.oid = t.oid), lower(c.data_type))
                                AS udt_name)
        FROM information_schema.columns c
        LEFT JOIN {FIX}.column_types t ON t.relname = c.table_name AND t.attname = c.column_name""")
    for name, (params, body) in _MACROS.items():
        db.execute(f"CREATE MACRO {FIX}.{name}({params}) AS {body}")
    _functions(db)
    _primary_keys(db)
    db.execute("SET lock_configuration = true")
    return db


def _functions(db: duckdb.DuckDBPyConnection) -> None:
    """DuckDB's functions (what a statement can call) in a pg_catalog schema, as pgcli completes
    them and DBeaver lists them; a function's result type is Postgres's OID of its DuckDB type."""
    names = [r[0] for r in db.execute("SELECT DISTINCT prorettype FROM pg_catalog.pg_proc "
                                      "WHERE prorettype IS NOT NULL").fetchall()]
    oids = [(n, o) for n, o in ((n, _duck_type_oid(n)) for n in names) if o is not None]
    db.execute(f"CREATE TABLE {FIX}.result_types (name VARCHAR, oid INTEGER)")
    if oids:
        db.executemany(f"INSERT INTO {FIX}.result_types VALUES (?, ?)", oids)
    db.execute(f"ALTER VIEW {FIX}.pg_proc RENAME TO pg_proc_duckdb")
    db.execute(f"""CREATE VIEW {FIX}.pg_proc AS
        SELECT p.* REPLACE ({PG_CATALOG_OID} AS pronamespace, coalesce(r.oid, {_ANYELEMENT}) AS prorettype)
        FROM {FIX}.pg_proc_duckdb p
        LEFT JOIN {FIX}.result_types r ON r.name = p.prorettype AND r.oid IN (SELECT oid FROM {FIX}.pg_type)""")
    db.execute(f"ALTER VIEW {FIX}.pg_namespace RENAME TO pg_namespace_schemas")
    db.execute(f"""CREATE VIEW {FIX}.pg_namespace AS SELECT * FROM {FIX}.pg_namespace_schemas
        UNION ALL BY NAME SELECT {PG_CATALOG_OID} AS oid, 'pg_catalog' AS nspname, 10 AS nspowner""")


def _duck_type_oid(name: str) -> int | None:
    """Postgres's OID of a DuckDB type named in its function list, or None (a generic type: T, ANY)."""
    upper = name.upper()
    if upper.endswith("[]"):
        element = _duck_type_oid(upper[:-2])
        return pgt.ARRAYS.get(element) if element is not None else None
    known = _DUCK_TO_ARROW.get(upper)
    return None if known is None or upper == "UUID" else pgt.oid_of(known)


_INDEX_OID = 1_000_000  # a store's primary-key index is its table's OID plus this (DuckDB lists none)


def _primary_keys(db: duckdb.DuckDBPyConnection) -> None:
    """Each store's key as a primary-key index in pg_index and pg_class, as pgjdbc's
    getPrimaryKeys and psql's \\d read it (DuckDB's views list no index for a PRIMARY KEY)."""
    db.execute(f"""CREATE VIEW {FIX}.pg_index AS
        SELECT c.oid + {_INDEX_OID} AS indexrelid, c.oid AS indrelid, 1::SMALLINT AS indnatts,
               1::SMALLINT AS indnkeyatts, true AS indisunique, true AS indisprimary, false AS indisexclusion,
               true AS indimmediate, false AS indisclustered, true AS indisvalid, false AS indcheckxmin,
               true AS indisready, true AS indislive, false AS indisreplident, [a.attnum] AS indkey,
               [0] AS indcollation, [0] AS indclass, [0] AS indoption, NULL::VARCHAR AS indexprs,
               NULL::VARCHAR AS indpred, false AS indnullsnotdistinct
        FROM pg_catalog.pg_class c
        JOIN {FIX}.column_types t ON t.relname = c.relname AND t.is_key
        JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attname = t.attname
        WHERE c.relkind = 'r'""")
    db.execute(f"""CREATE VIEW {FIX}.index_definitions AS
        SELECT c.oid + {_INDEX_OID} AS indexrelid, 'CREATE UNIQUE INDEX ' || c.relname || '_pkey ON {STORES}.' || c.relname
               || ' USING btree (' || t.attname || ')' AS indexdef, t.attname AS keydef
        FROM pg_catalog.pg_class c JOIN {FIX}.column_types t ON t.relname = c.relname AND t.is_key
        WHERE c.relkind = 'r'""")
    # the key's constraint names its index, as Postgres's does (SQLAlchemy joins them); DuckDB's
    # NOT NULL rows would read as exclusion constraints ('x'), which Postgres does not list
    db.execute(f"ALTER VIEW {FIX}.pg_constraint RENAME TO pg_constraint_all")
    db.execute(f"""CREATE VIEW {FIX}.pg_constraint AS
        SELECT k.* REPLACE (
            CASE WHEN k.contype = 'p' THEN c.relname || '_pkey' ELSE k.conname END AS conname,
            CASE WHEN k.contype = 'p' THEN k.conrelid + {_INDEX_OID} ELSE k.conindid END AS conindid,
            CASE WHEN k.contype = 'p' THEN (SELECT i.indkey FROM {FIX}.pg_index i WHERE i.indrelid = k.conrelid)
                 ELSE k.conkey END AS conkey)
        FROM {FIX}.pg_constraint_all k LEFT JOIN pg_catalog.pg_class c ON c.oid = k.conrelid
        WHERE k.contype <> 'x'""")
    db.execute(f"ALTER VIEW {FIX}.pg_class RENAME TO pg_class_relations")
    db.execute(f"""CREATE VIEW {FIX}.pg_class AS
        SELECT * FROM {FIX}.pg_class_relations
        UNION ALL BY NAME
        SELECT c.oid + {_INDEX_OID} AS oid, c.relname || '_pkey' AS relname, c.relnamespace, 'i' AS relkind,
               0 AS relam, 0 AS reltablespace, 1 AS relnatts, 'p' AS relpersistence, false AS relispartition,
               false AS relhasindex, false AS relforcerowsecurity, false AS relrowsecurity
        FROM {FIX}.pg_class_relations c WHERE c.relkind = 'r'""")


def _ident(name: str) -> str:
    return name.replace('"', '""')


_DUCK_TO_ARROW = {"BOOLEAN": pa.bool_(), "TINYINT": pa.int8(), "SMALLINT": pa.int16(), "INTEGER": pa.int32(),
                  "BIGINT": pa.int64(), "UTINYINT": pa.uint8(), "USMALLINT": pa.uint16(), "UINTEGER": pa.uint32(),
                  "UBIGINT": pa.uint64(), "FLOAT": pa.float32(), "DOUBLE": pa.float64(), "VARCHAR": pa.string(),
                  "BLOB": pa.binary(), "DATE": pa.date32(), "TIME": pa.time64("us"), "TIMESTAMP": pa.timestamp("us"),
                  "TIMESTAMP WITH TIME ZONE": pa.timestamp("us", tz="UTC"), "UUID": pa.string(), "HUGEINT": pa.decimal128(38, 0),
                  # sqlglot's spellings of the same types (parameter types come from its annotation)
                  "INT": pa.int32(), "INT4": pa.int32(), "INT8": pa.int64(), "INT2": pa.int16(), "REAL": pa.float32(),
                  "BOOL": pa.bool_(), "TEXT": pa.string(), "TIMESTAMPTZ": pa.timestamp("us", tz="UTC"),
                  "FLOAT4": pa.float32(), "FLOAT8": pa.float64(), "BYTEA": pa.binary(), "VARBINARY": pa.binary()}


def _arrow_of_duck(t: str) -> pa.DataType:
    t = str(t).upper()
    if t.endswith("[]"):
        return pa.list_(_arrow_of_duck(t[:-2]))
    m = re.fullmatch(r"DECIMAL\((\d+),\s*(\d+)\)", t)
    if m:
        return pa.decimal128(int(m.group(1)), int(m.group(2)))
    return _DUCK_TO_ARROW.get(t, pa.string())


def _oid_of_duck(t: str) -> int:
    if str(t).upper() in ("UNKNOWN", "NULL", "ANY", "VARCHAR"):
        return pgt.VARCHAR  # what the client binds is read as text and cast where it is used
    return pgt.oid_of(_arrow_of_duck(t))


def _parameters(tree: exp.Expression) -> list[exp.Expression]:
    return [n for n in tree.find_all(exp.Placeholder, exp.Parameter, bfs=False)
            if not (isinstance(n, exp.Parameter) and isinstance(n.this, exp.Literal) and n.this.is_string)]


def _parameter_index(node: exp.Expression, in_order: list[exp.Expression]) -> int:
    """0-based: $n is n - 1; a ? is its place among the ?s."""
    number = node.this.this if isinstance(node, exp.Parameter) else node.this
    if number and str(number).isdigit():
        return int(number) - 1
    anonymous = [n for n in in_order if not n.this]
    return next((i for i, n in enumerate(anonymous) if n is node), 0)


def _parameter_types(tree: exp.Expression, stores: dict[str, StoreDefinition], count: int) -> list[str]:
    from sqlglot.optimizer.annotate_types import annotate_types
    from sqlglot.optimizer.qualify import qualify

    numbers = [_parameter_index(n, _parameters(tree)) for n in _parameters(tree)]
    types = ["VARCHAR"] * (max(numbers) + 1 if numbers else 0)
    schema = {name: {f.name: sql_type_name(f.type) for f in d.arrow_schema()} for name, d in stores.items()}
    try:
        typed = annotate_types(qualify(tree.copy(), schema=schema, dialect="duckdb", validate_qualify_columns=False),
                               schema=schema)
    except Exception:  # noqa: BLE001 - sqlglot cannot type it: every parameter is text
        return types
    found = _parameters(typed)
    for node in found:
        parent, index = node.parent, _parameter_index(node, found)
        if isinstance(parent, (exp.Limit, exp.Offset)):
            types[index] = "BIGINT"
            continue
        array = _quantified(node)  # x = ANY($1): an array of x's type (pgcli binds relkinds so)
        if array is not None:
            node, parent = array, array.parent
            types[index] = "VARCHAR[]"
        other = None
        if isinstance(parent, exp.Binary):
            other = parent.expression if parent.this is node else parent.this
        elif isinstance(parent, (exp.In, exp.Between)):
            other = parent.this
        if other is not None and other.type is not None and not other.type.is_type(exp.DataType.Type.UNKNOWN):
            types[index] = other.type.sql(dialect="duckdb") + ("[]" if array is not None else "")
    return types


def _quantified(node: exp.Expression) -> exp.Expression | None:
    """The ``ANY(...)``/``ALL(...)`` that ``node`` is the whole argument of, if so."""
    parent = node.parent.parent if isinstance(node.parent, exp.Paren) else node.parent
    if isinstance(parent, exp.Any) or (isinstance(parent, exp.Anonymous) and str(parent.this).upper() in ("ANY", "ALL")):
        return parent
    return None


# ---- statements ------------------------------------------------------------------------------

def rewrite(tree: exp.Expression, session: dict[str, str], user: str, pid: int) -> exp.Expression:
    """``tree`` with the session's catalog functions answered and fixed catalog views named."""
    for select in tree.find_all(exp.Select):  # Postgres names such a column after its function
        for e in list(select.expressions):
            name = _function_name(e)
            if name in _SESSION_FUNCTIONS | _FUNCTIONS:
                e.replace(exp.alias_(e.copy(), name, quoted=True))
    return tree.transform(_Fix(session, user, pid))


class _Fix:
    """One node of a statement as DuckDB over FIX's views answers it (``exp.transform``'s
    function): transform does not walk into what it returns, so each part it builds is
    fixed here."""

    def __init__(self, session: dict[str, str], user: str, pid: int) -> None:
        self.session, self.user, self.pid = session, user, pid

    def __call__(self, node: exp.Expression) -> exp.Expression:
        fixed = self._table(node) if isinstance(node, exp.Table) else self._value(node)
        if fixed is not None:
            return fixed
        name = _function_name(node)
        return node if name is None else self._function(node, name)

    def _table(self, node: exp.Table) -> exp.Expression | None:
        """A catalog table as FIX's view of it, or a scalar function in FROM as its row."""
        db = (node.db or "").lower()
        if db == "information_schema" and node.name.lower() == "columns":  # with Postgres's type names
            return exp.Table(this=exp.to_identifier("information_schema_columns"), db=exp.to_identifier(FIX),
                             alias=node.args.get("alias") or exp.TableAlias(this=exp.to_identifier("columns")))
        if node.name.lower() == "pg_settings" and db in ("", "pg_catalog"):
            return _settings_table(self.session, node.alias_or_name)
        if node.name.lower() in _TABLES and db in ("", "pg_catalog"):
            return exp.Table(this=exp.to_identifier(node.name.lower()), db=exp.to_identifier(FIX),
                             alias=node.args.get("alias"))
        if not isinstance(node.this, exp.Identifier) and db == "pg_catalog":
            node.set("db", None)  # pg_catalog.generate_series(...): DuckDB's own table function
        if isinstance(node.this, exp.Func) and not _sets_of_rows(node.this):
            # a scalar function in FROM is one row with one column, named by the alias (Postgres);
            # DuckDB reads it as a table function
            alias = node.alias or "value"
            row = exp.select(exp.alias_(node.this.copy().transform(self), alias, quoted=True))
            return exp.Subquery(this=row, alias=exp.TableAlias(this=exp.to_identifier(alias)))
        return None

    def _value(self, node: exp.Expression) -> exp.Expression | None:
        """Columns, calls, literals and casts Postgres reads otherwise than DuckDB."""
        if isinstance(node, exp.Column) and node.args.get("db") is not None \
                and node.args["db"].name.lower() in CATALOG_SCHEMAS:
            # pg_catalog.pg_class.relname, as SQLAlchemy writes it, is pg_class.relname: DuckDB binds
            # no schema of pg_catalog's tables in a correlated subquery, nor of FIX's in their place
            node.set("db", None)
            node.set("catalog", None)
        if isinstance(node, exp.Dot) and isinstance(node.expression, exp.Anonymous):
            inner = node.expression  # pg_catalog.f(...): the call itself
            if isinstance(node.this, exp.Identifier) and node.this.name.lower() in CATALOG_SCHEMAS:
                return self(inner.copy().transform(self))
        if isinstance(node, exp.Literal) and node.is_string and node.this.startswith("{") and _quantified(node):
            return _array_of(node.this)  # x = ANY('{r,p}'), as psycopg writes a list into SQL
        if isinstance(node, exp.Cast) and node.to.is_type(exp.DataType.Type.ARRAY) and node.this.is_string \
                and node.this.this.startswith("{"):
            return exp.cast(_array_of(node.this.this), node.to)  # '{r,p}'::text[]: DuckDB reads no such literal
        if isinstance(node, (exp.EQ, exp.NEQ)) and all(
                isinstance(side, exp.Cast) and _object_type(side.to) for side in (node.this, node.expression)):
            # a::regtype <> 'trigger'::regtype (pgcli) compares OIDs, where a lone a::regtype is a name
            return node.__class__(**{k: _object_oid(side.this.transform(self), _object_type(side.to))
                                     for k, side in (("this", node.this), ("expression", node.expression))})
        if isinstance(node, exp.Cast):
            target = _object_type(node.to)
            if target is not None:
                return _object_cast(node.this.transform(self), target)
            named = node.to.sql(dialect="postgres")
            if named.lower().startswith("pg_catalog."):  # ::pg_catalog.text is ::text
                try:
                    node.set("to", exp.DataType.build(named[len("pg_catalog."):], dialect="postgres"))
                except Exception:  # noqa: BLE001 - a type sqlglot does not know: DuckDB says so
                    pass
        return None

    def _function(self, node: exp.Expression, name: str) -> exp.Expression:
        """A catalog or session function's call: answered, or FIX's function named."""
        if name in _LOOKUPS:
            return _lookup(*_LOOKUPS[name], [a.transform(self) for a in node.args.get("expressions") or []])
        if name in _RENAMED:
            return exp.Anonymous(this=_RENAMED[name], expressions=[a.transform(self) for a in node.expressions])
        if name in _FUNCTIONS:
            arguments = [a.transform(self) for a in node.args.get("expressions") or []]
            return exp.Dot(this=exp.to_identifier(FIX), expression=exp.Anonymous(this=name, expressions=arguments))
        if name == "current_schemas":  # the search path; with pg_catalog when asked for the implicit schemas
            given = node.expressions if isinstance(node, exp.Anonymous) else [node.this] if node.this else []
            implicit = (given or [exp.true()])[0].transform(self)
            listed = [exp.Literal.string(STORES)]
            return exp.case().when(implicit, exp.Array(expressions=[exp.Literal.string("pg_catalog"), *listed])) \
                .else_(exp.Array(expressions=listed))
        if name == "current_setting":
            args = list(node.args.get("expressions") or [])
            setting = args[0] if args else node.args.get("this")
            if isinstance(setting, exp.Literal) and setting.is_string:
                value = self.session.get(setting.this.lower())
                return exp.Null() if value is None else exp.Literal.string(value)
            return node
        constant = self._constant(name)
        return node if constant is None else constant

    def _constant(self, name: str) -> exp.Expression | None:
        """What a function of the session alone answers."""
        if name == "version":
            return exp.Literal.string(f"PostgreSQL {SERVER_VERSION} on Federator (DuckDB engine)")
        if name in ("current_user", "session_user", "user"):
            return exp.Literal.string(self.user)
        if name == "current_schema":
            return exp.Literal.string(STORES)
        if name in ("current_database", "current_catalog"):
            return exp.Literal.string("federator")
        if name == "pg_backend_pid":
            return exp.Literal.number(self.pid)
        return None


def _settings_table(session: dict[str, str], alias: str) -> exp.Expression:
    """pg_settings: the session's settings, as SHOW gives them (pgjdbc reads max_index_keys here)."""
    rows = sorted(session.items()) or [("", "")]
    values = exp.values(rows, alias="s", columns=["name", "setting"])
    columns = ["name", "setting", *(exp.alias_(exp.cast(exp.Null(), "VARCHAR"), c) for c in (
        "unit", "category", "short_desc", "extra_desc", "context", "vartype", "source", "boot_val", "reset_val"))]
    return exp.select(*columns).from_(values).subquery(alias)


def _lookup(table: str, key: str, value: str, column_value: str, arguments: list[exp.Expression]) -> exp.Expression:
    """The value for ``arguments[0]`` in ``table`` of FIX; ``column_value`` when a second argument is
    a column's number (not 0). Further arguments (pretty printing) change nothing here, but stay
    in the statement: a parameter given for them is bound."""
    first, second, *rest = arguments + [exp.Null()] * max(0, 2 - len(arguments))
    picked: exp.Expression = exp.column(value)
    if len(arguments) > 1:
        picked = exp.If(this=exp.EQ(this=exp.func("coalesce", second, exp.Literal.number(0)),
                                    expression=exp.Literal.number(0)),
                        true=exp.column(value), false=exp.column(column_value))
    condition: exp.Expression = exp.EQ(this=exp.column(key), expression=first)
    for extra in rest:
        condition = exp.and_(condition, exp.or_(exp.Is(this=extra, expression=exp.Null()), exp.true()))
    fixed = exp.Table(this=exp.to_identifier(table), db=exp.to_identifier(FIX))
    return exp.Subquery(this=exp.select(picked).from_(fixed).where(condition))


def _object_type(to: exp.Expression) -> str | None:
    """regclass, regtype, oid ... of a cast's target (Postgres's object identifier types)."""
    text = to.sql(dialect="postgres").lower().replace("pg_catalog.", "")
    return text if text in ("regclass", "regtype", "regproc", "regprocedure", "regnamespace", "regrole", "oid",
                            "regoper", "regconfig") else None


def _array_of(text: str) -> exp.Expression:
    """A Postgres array literal's text, ``{a,"b c",NULL}``, as an array of its elements' texts."""
    try:
        elements = pgt.array_text_elements(text)
    except ValueError as e:
        raise SqlError("SQL_PARSE_ERROR", f"{text!r} is not an array literal: {e}") from None
    return exp.Array(expressions=[exp.Null() if e is None else exp.Literal.string(e) for e in elements])


def _object_oid(value: exp.Expression, target: str | None) -> exp.Expression:
    """The OID an object identifier cast stands for: of a name, looked up; else the number."""
    if isinstance(value, exp.Literal) and value.is_string and not value.this.isdigit():
        return _object_cast(value, target or "oid")
    return exp.cast(value, "INTEGER")


def _object_cast(value: exp.Expression, target: str) -> exp.Expression:
    """An object identifier cast as DuckDB can answer it: a name literal becomes its OID, an OID
    stays a number, except ::regtype of an OID, which tools cast to print the type's name. A
    parameter may be either: a name (SQLAlchemy binds 'pg_catalog.pg_class') or an OID."""
    named = isinstance(value, exp.Literal) and value.is_string and not value.this.isdigit()
    if named or (isinstance(value, (exp.Placeholder, exp.Parameter)) and target in ("regclass", "regtype")):
        if target == "regclass":
            return exp.Dot(this=exp.to_identifier(FIX), expression=exp.Anonymous(this="to_regclass", expressions=[value]))
        if target == "regtype":
            return exp.Dot(this=exp.to_identifier(FIX), expression=exp.Anonymous(this="to_regtype", expressions=[value]))
        return exp.Null()
    if target == "regtype":
        return exp.Dot(this=exp.to_identifier(FIX), expression=exp.Anonymous(
            this="format_type", expressions=[exp.cast(value, "INTEGER"), exp.Literal.number(-1)]))
    return exp.cast(value, "INTEGER")


def _sets_of_rows(func: exp.Func) -> bool:
    """A function that gives rows (generate_series, unnest, ...), not one value."""
    name = func.sql_name().lower() if not isinstance(func, exp.Anonymous) else str(func.this).lower()
    return isinstance(func, (exp.ExplodingGenerateSeries, exp.GenerateSeries, exp.Unnest, exp.Explode)) or \
        name in ("generate_series", "unnest", "range", "json_each", "json_array_elements", "regexp_split_to_table")


# sqlglot's own expressions for some of the session's functions
_FUNCTION_CLASSES: dict[type, str] = {
    cls: name for cls, name in ((getattr(exp, c, None), n) for c, n in (
        ("CurrentVersion", "version"), ("CurrentUser", "current_user"), ("CurrentSchema", "current_schema"),
        ("CurrentDatabase", "current_database"), ("CurrentSchemas", "current_schemas"), ("CurrentCatalog", "current_catalog"),
        ("SessionUser", "session_user"))) if cls is not None}


def _function_name(node: exp.Expression) -> str | None:
    if isinstance(node, exp.Anonymous):
        return str(node.this).lower()
    return _FUNCTION_CLASSES.get(type(node))


def parse(sql: str) -> exp.Expression | None:
    """The statement as Postgres SQL, or None when sqlglot cannot read it (the engine says why)."""
    try:
        return sqlglot.parse_one(plain_sql(sql), read="postgres")
    except sqlglot.errors.SqlglotError:
        return None
