"""The `federator` command."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import NoReturn, Sequence

def _connection_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--bootstrap-servers", metavar="HOST:PORT",
        help="Kafka bootstrap servers (default: $FEDERATOR_BOOTSTRAP_SERVERS, else --kafka-config's "
             "bootstrap.servers, else 127.0.0.1:9092)",
    )
    p.add_argument(
        "--kafka-config", default=os.environ.get("FEDERATOR_KAFKA_CONFIG"), metavar="FILE",
        help="Kafka client properties for every client this makes, one NAME=VALUE a line, as Kafka's tools "
             "take --command-config, in librdkafka's names: security.protocol, sasl.mechanism, sasl.username, "
             "sasl.password, ssl.ca.location, ... (default: $FEDERATOR_KAFKA_CONFIG)",
    )
    p.add_argument(
        "--application-id", default=os.environ.get("FEDERATOR_APPLICATION_ID"), metavar="APP",
        required="FEDERATOR_APPLICATION_ID" not in os.environ,
        help="application id: names the catalog topic <APP>-catalog (default: $FEDERATOR_APPLICATION_ID)",
    )


# `federator node`'s limits (federator.sql.limits): flag, type, default, metavar, help
_LIMIT_FLAGS: list[tuple[str, type, object, str, str]] = [
    ("--max-body-bytes", str, "16MiB", "SIZE",
     "largest POST /v1/sql body; larger ones get 413 (default 16MiB; sizes like 64KB, 1MB, 1GiB)"),
    ("--max-sql-chars", int, 1024 * 1024, "N",
     "longest SQL text, HTTP and Flight SQL; longer gets 400 (default 1048576, also the most)"),
    ("--max-answer-rows", int, 10_000_000, "N",
     "most rows in an answer; more gets 422 saying how to page (default 10000000, 0 = no cap)"),
    ("--max-answer-bytes", str, "1GiB", "SIZE",
     "largest answer, as Arrow data; larger gets 422 saying how to page (default 1GiB, 0 = no cap)"),
    ("--max-timeout-ms", int, 600_000, "MS",
     "most a request's timeout_ms may be; one asking more runs with this, and its answer's stats say so "
     "(default 600000, 10 minutes)"),
    ("--max-running-queries", int, 2, "N",
     "queries (HTTP and Flight SQL) running at once on this node; more wait in arrival order (default 2: the "
     "node's Python runs one thread at a time, so more running together only lengthen each other's tail; "
     "raise it when long statements would hold both slots)"),
    ("--max-queued-queries", int, 12, "N",
     "queries waiting for a running slot, each at most its timeout_ms; more get 429 with Retry-After (default 12)"),
]


def _key_port(text: str) -> int | None:
    if text == "off":
        return None
    port = int(text)
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text} is not a port; give 0-65535, or off")
    return port


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="federator", description="SQL over the live state of a data pipeline.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    b = sub.add_parser("broker", help="run the local development broker (tansu, memory only) in the foreground")
    b.add_argument("--host", default="127.0.0.1")
    b.add_argument("--port", type=int, default=9092)

    s = sub.add_parser("store", help="create, list and describe stores")
    ssub = s.add_subparsers(dest="store_command", required=True, metavar="ACTION")
    c = ssub.add_parser("create", help="create a store's changelog topic and register its definition")
    c.add_argument("name")
    _connection_args(c)
    c.add_argument("--type", required=True, help="kv, window, session, versioned, or a plugin's store type")
    c.add_argument("--partitions", type=int, required=True)
    c.add_argument("--key", required=True, metavar="FORMAT", help="string, long, int, double or bytes")
    c.add_argument("--key-name", default="key", metavar="COL")
    value = c.add_mutually_exclusive_group(required=True)
    value.add_argument("--value", metavar="FORMAT", help="string, long, int, double or bytes")
    value.add_argument("--value-fields", metavar="NAME:TYPE,...", help="a JSON record value with these fields")
    c.add_argument("--value-name", default="value", metavar="COL")
    c.add_argument("--window-size-ms", type=int, metavar="MS", help="window length (window stores)")
    c.add_argument("--topic", help="changelog topic (default <APP>-<NAME>-changelog)")
    c.add_argument("--global", dest="is_global", action="store_true",
                   help="a global store: every node keeps all its partitions and answers it without calling "
                        "another node (for small tables joined with partitioned ones)")

    ls = ssub.add_parser("list", help="list the stores in the catalog")
    _connection_args(ls)
    ls.add_argument("--json", action="store_true", help="print definitions as JSON lines")
    d = ssub.add_parser("describe", help="show one store's definition and columns")
    d.add_argument("name")
    _connection_args(d)

    n = sub.add_parser("node", help="run a node: materialize stores, own partitions, answer queries over HTTP")
    _connection_args(n)
    n.add_argument("--listen", default="127.0.0.1:8080", metavar="HOST:PORT", help="HTTP address (default 127.0.0.1:8080)")
    n.add_argument("--advertise", metavar="HOST:PORT", help="address other nodes and clients use (default --listen)")
    n.add_argument("--state-dir", required=True, metavar="DIR", help="where this node keeps its RocksDB shards")
    n.add_argument("--standby-replicas", type=int, default=0, metavar="N", help="extra copies of each partition (default 0)")
    n.add_argument("--node-id", metavar="ID", help="stable node id (default: one kept in --state-dir)")
    n.add_argument("--cluster-secret-file", default=os.environ.get("FEDERATOR_CLUSTER_SECRET_FILE"), metavar="FILE",
                   help="a file holding the secret every node of the application shares, which node-to-node calls "
                        "(/internal/ and the key port) must carry (default $FEDERATOR_CLUSTER_SECRET_FILE, else "
                        "$FEDERATOR_CLUSTER_SECRET); required with --users-file or a --listen beyond loopback")
    n.add_argument("--cluster-secret", metavar="S",
                   help="the cluster secret itself; `ps` shows it to every local user: prefer --cluster-secret-file")
    n.add_argument("--threads", type=int, default=16,
                   help="HTTP worker threads (default 16); running and queued queries may hold all but 2, "
                        "which stay free for node-to-node calls")
    from federator.http.server_choice import SERVERS

    n.add_argument("--server", choices=SERVERS, default=None,
                   help="HTTP server: granian (Rust; ~4x less CPU per small request) or waitress (pure Python); "
                        "default $FEDERATOR_HTTP_SERVER, else granian")
    n.add_argument("--scan-cache-mb", type=int, default=256, metavar="MB",
                   help="memory for keeping unchanged shards' full scans as Arrow (default 256, 0 = off)")
    n.add_argument("--scan-cache-follow", type=int, default=50_000, metavar="N",
                   help="writes a kept scan is brought up to date with, per shard, before it is read "
                        "again from RocksDB instead (default 50000, 0 = drop it on any write)")
    n.add_argument("--kept-answers", type=int, default=16, metavar="N",
                   help="answers of small queries (top-k, rank, key sets) each store partition keeps and gives "
                        "again while nothing is written to it (default 16, 0 = off)")
    n.add_argument("--duckdb-memory-limit", default="2GB", metavar="SIZE",
                   help="memory DuckDB may use for this node's SQL before it spills to --state-dir/spill "
                        "(DuckDB's memory_limit, e.g. 512MB, 4GB; default 2GB)")
    n.add_argument("--reuse-answers-seconds", type=float, default=5.0, metavar="S",
                   help="answer a repeated deterministic statement from its last answer while every partition "
                        "it read is at the same position, for up to S seconds after it was computed; other "
                        "nodes' positions come from their positions watch on the key port, so such an answer "
                        "asks no owner (default 5, 0 = always run the statement)")
    limits = n.add_argument_group("limits and admission (each refusal is a JSON error saying what to change)")
    for flag, kind, default, metavar, what in _LIMIT_FLAGS:
        limits.add_argument(flag, type=kind, default=default, metavar=metavar, help=what)
    n.add_argument("--key-port", type=_key_port, default=0, metavar="P",
                   help="the port other nodes read single keys from this one on (a routed point lookup), on the "
                        "--listen host; default 0 = any free port (peers learn it from the heartbeat); "
                        "'off': none, and peers read this node's keys over HTTP on the general path")
    n.add_argument("--flight-sql-port", type=int, metavar="P",
                   help="also serve Arrow Flight SQL on this port, on the --listen host (default: off)")
    n.add_argument("--pg-port", type=int, metavar="P",
                   help="also serve the Postgres wire protocol (psql, JDBC, psycopg, BI tools) on this port, on the "
                        "--listen host; users of --users-file log in with their token as password (default: off)")
    n.add_argument("--users-file", default=os.environ.get("FEDERATOR_USERS_FILE"), metavar="FILE",
                   help="users whose bearer tokens the public API, the console's calls and Flight SQL accept "
                        "(`federator users add`); default $FEDERATOR_USERS_FILE; none: open to anyone who can "
                        "reach the node, so only on a loopback --listen unless --allow-anonymous")
    n.add_argument("--allow-anonymous", action="store_true",
                   help="serve without --users-file on a --listen address other machines can reach")
    tls = n.add_argument_group("TLS (every port of the node, and its calls to other nodes; see README \"TLS\")")
    tls.add_argument("--tls-cert", default=os.environ.get("FEDERATOR_TLS_CERT"), metavar="PEM",
                     help="the node's certificate (chain), naming its advertised host (default $FEDERATOR_TLS_CERT)")
    tls.add_argument("--tls-key", default=os.environ.get("FEDERATOR_TLS_KEY"), metavar="PEM",
                     help="the certificate's private key (default $FEDERATOR_TLS_KEY)")
    tls.add_argument("--tls-ca", default=os.environ.get("FEDERATOR_TLS_CA"), metavar="PEM",
                     help="the CA certificates peers' certificates are checked against (default $FEDERATOR_TLS_CA, "
                          "else --tls-cert itself: one self-signed certificate shared by every node)")
    n.add_argument("--plugin-errors", choices=("fatal", "warn"), default="fatal",
                   help="a plugin that fails to load: fatal (default) stops the node before it joins the cluster; "
                        "warn logs it and serves without it (its stores and queries are unknown to this node)")
    from federator.node.timings import GroupTimings

    group = n.add_argument_group("the consumer group (the broker's group.min/max.session.timeout.ms bound these)")
    group.add_argument("--session-timeout-ms", type=int, default=GroupTimings.session_timeout_ms, metavar="MS",
                       help="how long the group waits for a silent node before moving its partitions "
                            f"(default {GroupTimings.session_timeout_ms}, Apache Kafka's shortest by default)")
    group.add_argument("--heartbeat-interval-ms", type=int, default=GroupTimings.heartbeat_interval_ms, metavar="MS",
                       help=f"how often the node tells the group it is alive (default {GroupTimings.heartbeat_interval_ms})")

    from federator.client.sql_cli import add_sql_parser

    add_sql_parser(sub)

    sub.add_parser("plugins", help="list the installed plugins, what each provides, and any that failed to load")

    users = sub.add_parser("users", help="the users a node accepts (--users-file): bearer tokens, kept hashed")
    usub = users.add_subparsers(dest="users_command", required=True)
    for name, what in (("add", "add a user with a new token, printed once"), ("list", "list the users")):
        u = usub.add_parser(name, help=what)
        if name == "add":
            u.add_argument("name", help="letters, digits and _.@- (up to 64)")
        u.add_argument("--users-file", default=os.environ.get("FEDERATOR_USERS_FILE"), metavar="FILE",
                       help="the users file (default $FEDERATOR_USERS_FILE)")

    demo = sub.add_parser("demo", help="the main job: broker, pipeline, nodes and example queries")
    demo.add_argument("--dir", default=".federator/demo", help="where state lives (default .federator/demo)")
    demo.add_argument("--events", type=int, default=1_000_000, help="game events to generate")
    demo.add_argument("--exit", action="store_true", help="stop after the examples instead of serving")
    demo.add_argument("--port", type=int, default=9092, help="broker port")
    demo.add_argument("--bootstrap-servers", metavar="HOST:PORT",
                      help="run on this Kafka cluster instead of starting a local broker")
    demo.add_argument("--kafka-config", default=os.environ.get("FEDERATOR_KAFKA_CONFIG"), metavar="FILE",
                      help="that cluster's client properties, as for `federator node` (default $FEDERATOR_KAFKA_CONFIG)")
    return parser


def _store_create(args: argparse.Namespace) -> int:
    from federator.catalog import Catalog, StoreDefinition, changelog_topic, parse_value_fields
    from federator.plugin import load_plugins

    value: dict = {}
    if args.value_fields:
        value = {"format": "json", "fields": [{"name": n, "type": t} for n, t in parse_value_fields(args.value_fields)]}
    else:
        value = {"format": args.value, "name": args.value_name}
    d = {
        "name": args.name,
        "type": args.type,
        "topic": args.topic or changelog_topic(args.application_id, args.name),
        "partitions": args.partitions,
        "key": {"name": args.key_name, "format": args.key},
        "value": value,
    }
    if args.window_size_ms is not None:
        d["window_size_ms"] = args.window_size_ms
    if args.is_global:
        d["global"] = True
    registry = load_plugins()
    defn = StoreDefinition.from_dict(d, registry)
    created = Catalog(args.bootstrap_servers, args.application_id, registry).register(defn)
    verb = "created" if created else "already exists with this definition:"
    print(f"store {defn.name} {verb} topic {defn.topic}, {defn.partitions} partitions"
          + (", global (every node keeps every partition)" if defn.is_global else ""))
    return 0


def _store_list(args: argparse.Namespace) -> int:
    from federator.catalog import Catalog
    from federator.plugin import load_plugins

    stores = Catalog(args.bootstrap_servers, args.application_id, load_plugins()).load()
    if args.json:
        for defn in stores.values():
            print(json.dumps(defn.to_dict(), sort_keys=True))
        return 0
    if not stores:
        print(f"no stores in application {args.application_id!r}; create one with `federator store create`")
        return 0
    rows = [("NAME", "TYPE", "PARTITIONS", "SCOPE", "KEY", "VALUE", "TOPIC")]
    for defn in sorted(stores.values(), key=lambda s: s.name):
        value = ",".join(f"{n}:{t}" for n, t in defn.value_fields) if defn.value_fields else f"{defn.value_name}:{defn.value_format}"
        rows.append((defn.name, defn.type, str(defn.partitions), defn.scope, f"{defn.key_name}:{defn.key_format}",
                     value, defn.topic))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    return 0


def _store_describe(args: argparse.Namespace) -> int:
    from federator.catalog import Catalog
    from federator.plugin import load_plugins

    defn = Catalog(args.bootstrap_servers, args.application_id, load_plugins()).get(args.name)
    if defn is None:
        print(f"error: no store {args.name!r} in application {args.application_id!r}; "
              "see `federator store list`", file=sys.stderr)
        return 2
    print(json.dumps(defn.to_dict(), indent=2, sort_keys=True))
    print("columns:")
    for f in defn.arrow_schema():
        print(f"  {f.name}: {f.type}")
    return 0


def _plugins() -> int:
    from federator.plugin import load_plugins
    from federator.plugin.loader import ENV, GROUP

    registry = load_plugins()
    installed = [p for p in registry.plugins if not p.builtin]
    if not installed and not registry.failures:
        print(f"no plugins installed (entry point group {GROUP}; {ENV} may limit them)")
    for p in installed:
        print(f"{p.name}  ({p.distribution} {p.version})")
        for what in p.provides:
            print(f"    {what}")
    for f in registry.failures:
        print(f"{f.name}  FAILED to load ({f.source}): {f.error}")
    for p in registry.plugins:
        if p.builtin:
            print(f"built in: {', '.join(p.provides)}")
    return 1 if registry.failures else 0


def _users(args: argparse.Namespace) -> int:
    from federator.auth import Users, add_user

    if not args.users_file:
        raise ValueError("name the users file: --users-file FILE or $FEDERATOR_USERS_FILE")
    if args.users_command == "add":
        token = add_user(args.users_file, args.name)
        print(f"added user {args.name!r} to {args.users_file}; its token (shown this once, keep it secret):",
              file=sys.stderr)
        print(token)
        return 0
    for name in Users.load(args.users_file).verifiers:
        print(name)
    return 0


def _exit_now(code: int) -> NoReturn:
    """End a node that has stopped everything it owns (partitions handed over, shards closed
    with their offsets, the group left) without the interpreter's teardown: that destroys
    gRPC's and granian's native objects while their threads may still be running, and once
    turned a clean SIGTERM stop into SIGABRT."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _use_kafka_config(args: argparse.Namespace) -> None:
    """Settle --bootstrap-servers and have every Kafka client of this process use --kafka-config."""
    from federator import kafka, kafka_properties

    props = kafka_properties.load(args.kafka_config) if args.kafka_config else None
    from_file = props.values.get("bootstrap.servers") if props else None
    args.bootstrap_servers = args.bootstrap_servers or os.environ.get("FEDERATOR_BOOTSTRAP_SERVERS") or from_file \
        or "127.0.0.1:9092"
    if props is not None:
        kafka.use_client_properties(args.bootstrap_servers, props)


def _extras_needed(args: argparse.Namespace) -> list[str]:
    """The extras of the distribution a command runs on; `sql` and `users` need none."""
    if args.command == "broker":
        return ["broker"]
    if args.command in ("store", "node", "plugins"):
        return ["node"]
    if args.command == "demo":
        return ["node", "spark"] + ([] if args.bootstrap_servers else ["broker"])
    return []


def _missing_extras(args: argparse.Namespace) -> str | None:
    """What to install when the command's extras are not (the client alone was installed)."""
    from federator import extras

    lacking = {extra: extras.missing(extra) for extra in _extras_needed(args)}
    lacking = {extra: names for extra, names in lacking.items() if names}
    if not lacking:
        return None
    names = ", ".join(sorted({n for ns in lacking.values() for n in ns}))
    return (f"`federator {args.command}` needs packages this install of Federator leaves out ({names}); "
            f"install them with: pip install 'federator[{','.join(lacking)}]'")


def _reported_errors(command: str) -> tuple[type[Exception], ...]:
    """The errors a command reports as one line (no traceback); the node's kinds only where they
    can occur, as importing them needs the node's packages."""
    if command in ("sql", "users", "broker"):
        return (ValueError,)  # UsersFileError too
    from federator.catalog import CatalogConflict, DefinitionError
    from federator.formats import FormatError
    from federator.kafka import KafkaUnavailable

    return (DefinitionError, CatalogConflict, FormatError, KafkaUnavailable, ValueError)


def main(argv: Sequence[str] | None = None, hard_exit: bool = False) -> int:
    """The ``federator`` command; returns its exit code. ``hard_exit``: a node that stopped
    ends the process at once (see _exit_now), as the installed command does."""
    args = build_parser().parse_args(argv)
    lacking = _missing_extras(args)
    if lacking:
        print(f"error: {lacking}", file=sys.stderr)
        return 2
    reported = _reported_errors(args.command)
    try:
        if hasattr(args, "kafka_config") and args.command != "demo":  # the demo hands them to its children
            _use_kafka_config(args)
        if args.command == "broker":
            from federator.broker import run_foreground

            return run_foreground(args.host, args.port)
        if args.command == "store":
            return {"create": _store_create, "list": _store_list, "describe": _store_describe}[args.store_command](args)
        if args.command == "node":
            from federator.node_command import run_node
            from federator.plugin import PluginsFailed

            try:
                code = run_node(args)
            except PluginsFailed as e:  # --plugin-errors fatal: the log named each; say so once more
                print(f"error: {e}", file=sys.stderr)
                return 2
            if hard_exit:
                _exit_now(code)
            return code
        if args.command == "sql":
            from federator.client.sql_cli import run_sql

            return run_sql(args)
        if args.command == "plugins":
            return _plugins()
        if args.command == "users":
            return _users(args)
        if args.command == "demo":
            from federator.demo import run_demo

            return run_demo(args)
    except reported as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a taken port, an unwritable state dir: the message says which
        print(f"error: {e.strerror or e}" + (f": {e.filename}" if e.filename else ""), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 1


def entry() -> None:
    """The installed ``federator`` command (and ``python -m federator.cli``)."""
    sys.exit(main(hard_exit=True))


if __name__ == "__main__":
    entry()
