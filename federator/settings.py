"""The settings of `federator node`, each declared once here: its type, default, help text,
environment variable, and whether it is a secret.

Three sources fill them, and the first that names a setting wins: the command's flags, then
the environment, then a TOML file (``--config FILE``, one key per setting, as named here),
then the default. The command line's flags, ``--print-config`` and the docs' settings table
and sample file are all made from this table, and the modules that apply a setting read its
default here (``NodeSettings.scan_cache_mb`` is the scan cache's default budget).

Standard library only: the command line builds its parser from it before anything heavy is
imported, and the lowest layers may read their defaults from it.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import re
import textwrap
import tomllib
import typing
import warnings
from dataclasses import dataclass, field
import os
from typing import Any, Mapping

SERVERS = ("granian", "waitress", "loop")  # the HTTP servers a node runs on (federator.http)
PLUGIN_ERRORS = ("fatal", "warn")  # what a plugin that failed to load does to the node
FLAG, ENV, FILE, DEFAULT = "flag", "environment", "file", "default"  # where a value came from, strongest first
MASK = "********"  # a secret as --print-config shows it
LOCAL_BROKER = "127.0.0.1:9092"  # the bootstrap servers when neither a setting nor --kafka-config names them
# The largest single answer each answer cache keeps: a larger one costs more to hold than to make again
SHARD_ANSWER_MAX_BYTES = 64 << 10  # a store partition's small answers (shard_answers)
STATEMENT_ANSWER_MAX_BYTES = 1 << 20  # a statement's answer at the node it was asked of (statement_answers)
PARTITION_ANSWER_SHARE = 4  # one of other nodes' partition answers: at most this part of partition_answers_mb

# Groups, in the order the help and the docs show them: title, what they hold
GROUPS: dict[str, str] = {
    "kafka": "Kafka and the application",
    "node": "the node and its addresses",
    "memory": "memory: caches and DuckDB",
    "limits": "limits and admission (each refusal is a JSON error saying what to change)",
    "doors": "front doors besides HTTP",
    "security": "users, the cluster secret and TLS (every port of the node, and its calls to other nodes)",
    "group": "the consumer group (the broker's group.min/max.session.timeout.ms bound these)",
}


@dataclass(frozen=True)
class Meta:
    """What the table says of a setting beyond its name, type and default."""

    help: str
    group: str
    env: str | None = None
    secret: bool = False
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    size: bool = False  # bytes, given as 1048576, 64KB, 16MiB or 1GB
    port: bool = False  # a TCP port: 0-65535
    off: bool = False  # also takes "off" (None)
    sizing: str | None = None  # what the setting costs, for the docs
    required: bool = False
    unset: str | None = None  # what leaving an optional setting unset means
    was: str | None = None  # its former name, still read (flag and file key) with a warning to use this one


def _s(default: Any, help: str, group: str, **meta: Any) -> Any:
    return field(default=default, metadata={"meta": Meta(help, group, **meta)})


@dataclass
class NodeSettings:
    # ---- Kafka and the application
    bootstrap_servers: str | None = _s(
        None, "Kafka bootstrap servers", "kafka", env="FEDERATOR_BOOTSTRAP_SERVERS", metavar="HOST:PORT",
        unset=f"--kafka-config's bootstrap.servers, else {LOCAL_BROKER}")
    kafka_config: str | None = _s(
        None, "Kafka client properties for every client this makes, one NAME=VALUE a line, as Kafka's tools take "
              "--command-config, in librdkafka's names: security.protocol, sasl.mechanism, sasl.username, "
              "sasl.password, ssl.ca.location, ...", "kafka", env="FEDERATOR_KAFKA_CONFIG", metavar="FILE")
    fetch_wait_ms: int = _s(
        500, "how long the broker may hold the node's fetch of the topics it follows (changelogs, catalog, "
             "membership) when nothing new has come: "
             "Apache Kafka answers a held fetch the moment a record arrives, so waiting longer costs no "
             "latency and spares the broker empty fetches (Kafka's consumers wait 500 ms too). A broker "
             "that holds every fetch for the whole wait (the development broker, tansu) adds up to this "
             "to every read-your-writes: 10 there", "kafka", metavar="MS")
    apply_linger_ms: int = _s(
        100, "how long after applying a fetch of records the node may let the next ones gather before it applies "
            "them, so that a stream of small fetches (a producer's small batches) is applied a few fetches at a "
            "time, each partition's in one write: a read with a consistency token this node has not reached yet, "
            "asked here or by another node, has the records of the partitions it waits for applied at once; reads "
            "without a token may see the changelog up to this much later. 0 applies each fetch as it comes",
        "kafka", metavar="MS")
    application_id: str | None = _s(
        None, "application id: names the catalog topic <APP>-catalog", "kafka",
        env="FEDERATOR_APPLICATION_ID", metavar="APP", required=True)
    # ---- the node
    state_dir: str | None = _s(None, "where this node keeps its RocksDB shards", "node", metavar="DIR", required=True)
    listen: str = _s("127.0.0.1:8080", "HTTP address", "node", metavar="HOST:PORT")
    advertise: str | None = _s(None, "address other nodes and clients use", "node", metavar="HOST:PORT",
                               unset="--listen")
    node_id: str | None = _s(None, "stable node id", "node", metavar="ID",
                             unset="one kept in --state-dir")
    standby_replicas: int = _s(0, "extra copies of each partition", "node", metavar="N",
                               sizing="each copy costs another node the partition's disk and its share of writes")
    threads: int = _s(16, "HTTP worker threads; running and queued queries may hold all but 2, which stay free "
                          "for node-to-node calls", "node", metavar="N",
                      sizing="a thread holds its request's body and its answer while it sends it")
    server: str = _s("loop", "HTTP server: loop (an asyncio event loop that answers what needs no waiting itself, "
                     "the rest on --threads), granian (Rust, on --threads) or waitress (pure Python)",
                     "node", env="FEDERATOR_HTTP_SERVER", choices=SERVERS)
    plugin_errors: str = _s("fatal", "a plugin that fails to load: fatal stops the node before it joins the cluster; "
                                     "warn logs it and serves without it (its stores and queries are unknown to this "
                                     "node)", "node", choices=PLUGIN_ERRORS)
    # ---- memory
    scan_cache_mb: int = _s(256, "memory for keeping unchanged shards' full scans as Arrow (0 = off)", "memory",
                            metavar="MB", sizing="at most this many MiB for the whole node: the kept scans as Arrow, the "
                                                 "writes held beside them and the results made from them; the least "
                                                 "recently used go first")
    scan_cache_follow: int = _s(50_000, "writes a kept scan is brought up to date with, per shard, before it is read "
                                        "again from RocksDB instead (0 = drop it on any write)", "memory", metavar="N",
                                sizing="the held writes count against --scan-cache-mb")
    shard_answers: int = _s(16, "answers of small queries (top-k, rank, key sets) each store partition keeps and "
                                "gives again while nothing is written to it (0 = off)", "memory", metavar="N",
                            sizing=f"up to N answers of at most {SHARD_ANSWER_MAX_BYTES >> 10} KiB (larger ones "
                                   "are not kept) per store partition the node hosts", was="kept_answers")
    duckdb_memory_limit: str = _s("2GB", "memory DuckDB may use for this node's SQL before it spills to "
                                         "--state-dir/spill (DuckDB's memory_limit, e.g. 512MB, 4GB)", "memory",
                                  metavar="SIZE", sizing="a bound DuckDB keeps to by spilling to disk; the node's "
                                                         "other memory (shards, caches, answers) comes on top")
    reuse_answers_seconds: float = _s(
        5.0, "answer a repeated deterministic statement from its last answer while every partition it read is at "
             "the same position, for up to S seconds after it was computed; other nodes' positions come from their "
             "positions watch on the key port, so such an answer asks no owner (0 = always run the statement)",
        "memory", metavar="S", sizing="each kept statement holds its last answer until it is older than this")
    statement_answers: int = _s(
        256, "answers of repeated deterministic statements this node keeps, to give again within "
             "--reuse-answers-seconds while the partitions they read have not moved (0 = off)", "memory", metavar="N",
        sizing=f"up to N answers of at most {STATEMENT_ANSWER_MAX_BYTES >> 20} MiB (larger ones are not kept)")
    partition_answers_mb: int = _s(
        64, "memory for other nodes' answers for single partitions (a plugin's whole-partition index, read for "
            "ranks) this node keeps while those partitions have not moved (0 = off)", "memory", metavar="MB",
        sizing=f"at most this many MiB, least recently used dropped first; an answer over 1/{PARTITION_ANSWER_SHARE} "
               "of it is not kept")
    # ---- limits
    max_body_bytes: int = _s(16 * 1024**2, "largest POST /v1/sql body; larger ones get 413", "limits",
                             metavar="SIZE", size=True, sizing="read whole into memory, once per request being read")
    max_sql_chars: int = _s(1024 * 1024, "longest SQL text, HTTP and Flight SQL; longer gets 400 (the default is "
                                         "also the most)", "limits", metavar="N")
    max_answer_rows: int = _s(10_000_000, "most rows in an answer; more gets 422 saying how to page (0 = no cap)",
                              "limits", metavar="N")
    max_answer_bytes: int = _s(1024**3, "largest answer, as Arrow data; larger gets 422 saying how to page "
                                        "(0 = no cap)", "limits", metavar="SIZE", size=True,
                               sizing="an answer is built in memory before it is sent: up to this much per running "
                                      "query, so up to --max-running-queries times it at once")
    max_timeout_ms: int = _s(600_000, "most a request's timeout_ms may be; one asking more runs with this, and its "
                                      "answer's stats say so", "limits", metavar="MS")
    max_running_queries: int = _s(2, "queries (HTTP, Flight SQL, Postgres) running at once on this node; more wait "
                                     "in arrival order (the node's Python runs one thread at a time, so more running "
                                     "together only lengthen each other's tail; raise it when long statements would "
                                     "hold every slot)", "limits", metavar="N",
                                  sizing="each running query holds its answer and its share of --duckdb-memory-limit")
    max_queued_queries: int = _s(12, "queries waiting for a running slot, each at most its timeout_ms; more get 429 "
                                     "with Retry-After", "limits", metavar="N",
                                 sizing="each waiting query holds an HTTP thread and its request")
    # ---- front doors
    key_port: int | None = _s(0, "the port other nodes read single keys from this one on (a routed point lookup), "
                                 "on the --listen host; 0 = any free port (peers learn it from the heartbeat); "
                                 "off: none, and peers read this node's keys over HTTP on the general path",
                              "doors", metavar="P", port=True, off=True)
    flight_sql_port: int | None = _s(None, "also serve Arrow Flight SQL on this port, on the --listen host",
                                     "doors", metavar="P", port=True, unset="off")
    pg_port: int | None = _s(None, "also serve the Postgres wire protocol (psql, JDBC, psycopg, BI tools) on this "
                                   "port, on the --listen host; users of --users-file log in with their token as "
                                   "password", "doors", metavar="P", port=True, unset="off")
    # ---- security
    users_file: str | None = _s(None, "users whose bearer tokens the public API, the console's calls, Flight SQL "
                                      "and Postgres accept (`federator users add`)", "security",
                                env="FEDERATOR_USERS_FILE", metavar="FILE",
                                unset="open to anyone who can reach the node, so only on a loopback --listen unless "
                                      "--allow-anonymous")
    allow_anonymous: bool = _s(False, "serve without --users-file on a --listen address other machines can reach",
                               "security")
    cluster_secret_file: str | None = _s(
        None, "a file holding the secret every node of the application shares, which node-to-node calls "
              "(/internal/ and the key port) must carry; required with --users-file or a --listen beyond loopback",
        "security", env="FEDERATOR_CLUSTER_SECRET_FILE", metavar="FILE")
    cluster_secret: str | None = _s(None, "the cluster secret itself; on the command line `ps` shows it to every "
                                          "local user: prefer --cluster-secret-file", "security",
                                    env="FEDERATOR_CLUSTER_SECRET", metavar="S", secret=True)
    tls_cert: str | None = _s(None, "the node's certificate (chain), naming its advertised host", "security",
                              env="FEDERATOR_TLS_CERT", metavar="PEM")
    tls_key: str | None = _s(None, "the certificate's private key", "security", env="FEDERATOR_TLS_KEY",
                             metavar="PEM")
    tls_ca: str | None = _s(None, "the CA certificates peers' certificates are checked against", "security",
                            env="FEDERATOR_TLS_CA", metavar="PEM",
                            unset="--tls-cert itself: one self-signed certificate shared by every node")
    # ---- the consumer group
    session_timeout_ms: int = _s(6000, "how long the group waits for a silent node before moving its partitions "
                                       "(the default is Apache Kafka's shortest by default)", "group", metavar="MS")
    heartbeat_interval_ms: int = _s(1000, "how often the node tells the group it is alive", "group", metavar="MS")


# ---- the node's caches: what each keeps, and what bounds it ------------------------------------
# Limits small enough not to need a setting (entries that hold plans, not rows):
POINT_PLANS = 4096  # SQL texts the engine knows to be (or not be) a point lookup; then it forgets them all
STATEMENT_PLANS = 1024  # statements' plans by text and parameters; past it all are forgotten
PLAN_TEMPLATES = 256  # plans by text and parameter types, to bind other parameters into
JSON_ROWS = 64  # answers given again whose JSON rows are kept, so they are not encoded again
JSON_ROWS_MAX_BYTES = 64 * 1024  # the largest such JSON kept (UTF-8)


@dataclass(frozen=True)
class Cache:
    name: str
    keeps: str  # what it keeps, and until when
    bound: str  # what bounds it: the settings, or the fixed limits above
    module: str


CACHES: tuple[Cache, ...] = (
    Cache("scan cache", "each store partition's last full scan as Arrow, the writes held beside it and the results "
          "the owners' SQL made from them, until a write it cannot follow", "--scan-cache-mb for all of them, least "
          "recently used dropped first; --scan-cache-follow writes per scan", "federator.store.scan_cache"),
    Cache("shard answers", "small answers (top-k, rank, key sets) of each store partition, until its next write",
          f"--shard-answers per store partition, each at most {SHARD_ANSWER_MAX_BYTES >> 10} KiB",
          "federator.store.shard_answers"),
    Cache("shard derivations", "what a store type derives from a store partition (the leaderboard's sorted scores), "
          "until its next write", "one per derivation the store type names, per store partition, as large as the "
          "type makes it", "federator.store.shard"),
    Cache("statement answers", "answers of repeated deterministic statements at the node asked, while the partitions "
          "they read have not moved", f"--statement-answers, each at most {STATEMENT_ANSWER_MAX_BYTES >> 20} MiB, "
          "for --reuse-answers-seconds", "federator.sql.engine"),
    Cache("partition answers", "other nodes' answers for single partitions (a plugin's whole-partition index), while "
          "those partitions have not moved", f"--partition-answers-mb, each at most 1/{PARTITION_ANSWER_SHARE} of it, "
          "for --reuse-answers-seconds", "federator.dispatch.partition_answers"),
    Cache("statement plans", "statements' plans by text and parameters, and templates to bind other parameters into",
          f"{STATEMENT_PLANS} plans and {PLAN_TEMPLATES} templates; past either, all of that kind are forgotten",
          "federator.sql.engine"),
    Cache("point plans", "whether a statement's text is a point lookup, and its plan", f"{POINT_PLANS} texts, then "
          "all forgotten", "federator.sql.engine"),
    Cache("JSON rows", "the JSON rows of answers given again, so a repeated answer is not encoded again",
          f"{JSON_ROWS} answers of at most {JSON_ROWS_MAX_BYTES >> 10} KiB", "federator.http.formats"),
)


@dataclass(frozen=True)
class Setting:
    """One row of the table: a field of NodeSettings with its type and Meta."""

    name: str
    kind: type  # int, float, str or bool (the type without None, which means unset)
    default: Any
    meta: Meta

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def old_flag(self) -> str | None:
        """The flag of its former name (``Meta.was``), still taken with a warning."""
        return None if self.meta.was is None else "--" + self.meta.was.replace("_", "-")


def renamed(old: str, s: Setting) -> None:
    """Warn that ``old`` (a flag or a file key of ``s``'s former name) is to be replaced."""
    new = s.flag if old.startswith("--") else s.name
    warnings.warn(f"{old} is deprecated: it is now {new}, and the old name will go in a later release",
                  FutureWarning, stacklevel=3)


def _settings() -> tuple[Setting, ...]:
    hints = typing.get_type_hints(NodeSettings)
    rows = []
    for f in dataclasses.fields(NodeSettings):
        args = [a for a in typing.get_args(hints[f.name]) if a is not type(None)]
        kind = args[0] if args else hints[f.name]
        rows.append(Setting(f.name, kind, f.default, f.metadata["meta"]))
    return tuple(rows)


SETTINGS = _settings()
BY_NAME = {s.name: s for s in SETTINGS}
BY_FORMER_NAME = {s.meta.was: s for s in SETTINGS if s.meta.was is not None}


class SettingsError(ValueError):
    """A setting that cannot be used; the message names it and what to do."""


# ---- values: from text (flags, environment) and from TOML --------------------------------------
_SIZE = re.compile(r"^\s*(\d+)\s*(|B|KB|MB|GB|TB|KIB|MIB|GIB|TIB)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "KB": 1000, "MB": 1000**2, "GB": 1000**3, "TB": 1000**4,
          "KIB": 1024, "MIB": 1024**2, "GIB": 1024**3, "TIB": 1024**4}


def parse_size(text: str | int, flag: str) -> int:
    """Bytes from ``1048576``, ``64KB``, ``16MiB`` or ``1GB`` (KB, MB, GB are powers of 1000)."""
    if isinstance(text, int):
        return text
    m = _SIZE.match(text)
    if m is None:
        raise ValueError(f"{flag} must be a size such as 1048576, 64KB, 16MiB or 1GB, got {text!r}")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def size_text(n: int) -> str:
    """``16MiB`` for 16777216, ``64KB`` for 64000: a size as one would write it."""
    for unit, size in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024),
                       ("TB", 1000**4), ("GB", 1000**3), ("MB", 1000**2), ("KB", 1000)):
        if n and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def from_text(s: Setting, text: str, where: str) -> Any:
    """A setting's value from a flag's or a variable's text; ``where`` names it in errors."""
    if s.meta.off and text == "off":
        return None
    try:
        if s.meta.size:
            return parse_size(text, where)
        if s.kind is bool:
            if text.lower() not in ("true", "false", "1", "0"):
                raise ValueError
            return text.lower() in ("true", "1")
        value = s.kind(text)
    except ValueError as e:
        raise SettingsError(str(e) if s.meta.size else f"{where} must be {_expected(s)}, got {text!r}") from None
    _check_value(s, value, where)
    return value


def from_toml(s: Setting, value: Any, where: str) -> Any:
    """A setting's value as a TOML file gives it: its own type, no conversion but int to float."""
    if s.meta.off and value == "off":
        return None
    if s.meta.size and isinstance(value, str):
        return parse_size(value, where)
    ok = isinstance(value, s.kind) and not (s.kind is int and isinstance(value, bool))
    if s.kind is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if not ok:
        raise SettingsError(f"{where} must be {_expected(s)}, got {type(value).__name__} {value!r}")
    _check_value(s, value, where)
    return value


def _expected(s: Setting) -> str:
    if s.meta.choices:
        return "one of " + ", ".join(repr(c) for c in s.meta.choices)
    what = {int: "a whole number", float: "a number", str: "a string", bool: "true or false"}[s.kind]
    if s.meta.port:
        what = "a port, 0-65535"
    if s.meta.size:
        what = "a size (a whole number of bytes, or a string such as \"64KB\", \"16MiB\", \"1GB\")"
    return what + (', or "off"' if s.meta.off else "")


def _check_value(s: Setting, value: Any, where: str) -> None:
    if (s.meta.choices and value not in s.meta.choices) or (s.meta.port and not 0 <= value <= 65535):
        raise SettingsError(f"{where} must be {_expected(s)}, got {value!r}")


# ---- flags -------------------------------------------------------------------------------------
def default_text(s: Setting) -> str:
    """The default as the help and the docs show it."""
    if s.default is None:
        return f"unset: {s.meta.unset}" if s.meta.unset else "unset"
    return toml_value(s, s.default).strip('"')


def described(s: Setting, with_default: bool) -> str:
    """The help with what is given when nothing names the setting, and its variable."""
    if s.meta.required:
        given = "required"
    elif s.default is None:
        given = f"unset: {s.meta.unset}" if s.meta.unset else ""
    else:
        given = f"default {default_text(s)}" if with_default else ""
    about = "; ".join(part for part in (given, f"${s.meta.env}" if s.meta.env else "") if part)
    return f"{s.meta.help} ({about})" if about else s.meta.help


def add_flag(parser: argparse._ActionsContainer, s: Setting, from_env: bool = False) -> None:
    """``s`` as a flag. A node's flags default to nothing (argparse.SUPPRESS), so only the flags
    given reach resolve(); ``from_env``: the other commands' flags default to their variable."""
    env = s.meta.env
    default: Any = argparse.SUPPRESS
    if from_env:
        default = None if s.kind is bool else (os.environ.get(env) if env else s.default)
    kwargs: dict[str, Any] = {"default": default, "help": described(s, with_default=True).replace("%", "%%")}
    if s.kind is bool:
        parser.add_argument(s.flag, action="store_true", **kwargs)
        return
    required = from_env and s.meta.required and not (env and env in os.environ)

    def parse(text: str) -> Any:
        try:
            return from_text(s, text, s.flag)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    parser.add_argument(s.flag, type=parse, metavar=s.meta.metavar, choices=s.meta.choices, required=required,
                        **kwargs)
    if s.old_flag is not None:
        old = s.old_flag

        def parse_old(text: str) -> Any:
            renamed(old, s)
            return parse(text)

        parser.add_argument(old, dest=s.name, type=parse_old, metavar=s.meta.metavar, default=default,
                            help=f"deprecated: {s.flag}")


def add_node_flags(parser: argparse.ArgumentParser) -> None:
    """Every setting as a flag of `federator node`, in its group."""
    groups = {g: parser.add_argument_group(title) for g, title in GROUPS.items()}
    for s in SETTINGS:
        add_flag(groups[s.meta.group], s)


# ---- resolving: flags > environment > file > defaults ------------------------------------------
@dataclass
class Resolved:
    settings: NodeSettings
    sources: dict[str, str]  # setting -> FLAG, ENV, FILE or DEFAULT


def read_file(path: str) -> dict[str, Any]:
    """The settings a TOML file names, checked: an unknown key or a wrong type is an error naming it."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise SettingsError(f"cannot read --config {path!r}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise SettingsError(f"--config {path} is not TOML: {e}") from None
    values = {}
    for key, value in data.items():
        s = BY_NAME.get(key) or BY_FORMER_NAME.get(key)
        if s is not None and s.name != key:
            renamed(key, s)
            key = s.name
        if s is None:
            near = difflib.get_close_matches(key.replace("-", "_"), BY_NAME, 1)
            fix = f"did you mean {near[0]}?" if near else "the settings are listed by `federator node --print-config`"
            raise SettingsError(f"--config {path}: unknown setting {key!r}: {fix}")
        values[key] = from_toml(s, value, f"{key} in {path}")
    return values


def resolve(flags: Mapping[str, Any], environ: Mapping[str, str], config_file: str | None,
            complete: bool = True) -> Resolved:
    """The settings from ``flags`` (the parsed values of the flags given), ``environ`` and the
    TOML file, each setting from the strongest source that names it; ``complete``: a required
    setting left unset is an error."""
    from_file = read_file(config_file) if config_file else {}
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for s in SETTINGS:
        if s.name in flags:
            values[s.name], sources[s.name] = flags[s.name], FLAG
        elif s.meta.env and environ.get(s.meta.env):
            values[s.name] = from_text(s, environ[s.meta.env], f"${s.meta.env}")
            sources[s.name] = ENV
        elif s.name in from_file:
            values[s.name], sources[s.name] = from_file[s.name], FILE
        else:
            sources[s.name] = DEFAULT
    settings = NodeSettings(**values)
    for s in SETTINGS if complete else ():
        if s.meta.required and getattr(settings, s.name) is None:
            env = f", ${s.meta.env}" if s.meta.env else ""
            raise SettingsError(f"{s.flag} is required: give it as a flag{env}, or {s.name} in --config FILE")
    return Resolved(settings, sources)


def from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> Resolved:
    """The settings of a parsed `federator node` command line (add_node_flags, and --config)."""
    given = {name: value for name, value in vars(args).items() if name in BY_NAME}
    return resolve(given, environ, getattr(args, "config", None), complete=not getattr(args, "print_config", False))


# ---- showing them ------------------------------------------------------------------------------
def toml_value(s: Setting, value: Any) -> str:
    if value is None:
        return '"off"' if s.meta.off else ""
    if s.meta.size:
        text = size_text(value)
        return text if text.isdigit() else f'"{text}"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a JSON string is a TOML basic string
    return repr(value)


def to_toml(resolved: Resolved) -> str:
    """The effective settings as a TOML file that --config reads back, secrets masked; an unset
    setting is a comment, and each line says where its value came from."""
    lines = []
    for s in SETTINGS:
        value = getattr(resolved.settings, s.name)
        source = resolved.sources.get(s.name, DEFAULT)
        if s.meta.secret and value is not None:
            lines.append(f'{s.name} = "{MASK}"  # {source} (secret)')
        elif value is None and not s.meta.off:
            lines.append(f"# {s.name} =  ({'required, ' if s.meta.required else ''}unset)")
        else:
            lines.append(f"{s.name} = {toml_value(s, value)}" + ("" if source == DEFAULT else f"  # {source}"))
    return "\n".join(lines) + "\n"


def sample_toml() -> str:
    """A configuration file naming every setting at its default, with its help; the docs' sample."""
    out = ["# federator node --config FILE: every setting, at its default. A flag wins over its",
           "# environment variable, which wins over this file, which wins over the default.", ""]
    for group, title in GROUPS.items():
        out.append(f"# ---- {title}")
        for s in (s for s in SETTINGS if s.meta.group == group):
            out.extend(textwrap.wrap(described(s, with_default=False), 98, initial_indent="# ", subsequent_indent="# ", break_on_hyphens=False))
            if s.default is not None:
                out.append(f"{s.name} = {toml_value(s, s.default)}")
            else:
                placeholder = f'"{s.meta.metavar}"' if s.kind is str else f"<{s.meta.metavar}>"
                out.append(f"# {s.name} = {placeholder}")
        out.append("")
    return "\n".join(out)
