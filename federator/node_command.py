"""`federator node`: a node and its HTTP server in one process, until SIGINT/SIGTERM, or until it
finds that another live process has its node id (then it exits with REFUSED)."""

from __future__ import annotations

import gc
import ipaddress
import logging
import os
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Any

from federator.auth import Users
from federator.kafka import MAX_FETCH_WAIT_MS
from federator.settings import BY_NAME, ENV, FILE, FLAG, NodeSettings, Resolved
from federator.tls import Tls, from_flags
from federator.node.timings import GroupTimings
from federator.node.node import Node, NodeConfig
from federator.plugin import load_plugins
from federator.sql.limits import Limits
from federator.sql.service import SqlService

log = logging.getLogger(__name__)

REFUSED = 3  # the exit code of a node that refused to serve: another live node has its node id, or the
# broker will never let it into the group


def _host_port(text: str, flag: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{flag} must be HOST:PORT, got {text!r}")
    return host or "0.0.0.0", int(port)


def arrow_memory_pool() -> str:
    """Have pyarrow allocate from jemalloc (the system allocator where pyarrow has no jemalloc),
    unless $ARROW_DEFAULT_MEMORY_POOL names a pool; returns the pool's name.

    pyarrow's default, mimalloc, commits its memory eagerly and keeps what a query freed
    resident: the short-lived buffers of building a large answer (each shard's scan in
    chunks, then joined) stayed in the node's RSS, raising the peak of a large SELECT *
    (tests/bench/test_bench_join.py measures it). jemalloc was as fast on the node's Arrow
    work and returns freed pages soon after."""
    import pyarrow as pa

    if os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):  # the operator's choice, which Arrow applies itself
        return pa.default_memory_pool().backend_name
    try:
        pool = pa.jemalloc_memory_pool()
    except NotImplementedError:  # a pyarrow built without jemalloc
        pool = pa.system_memory_pool()
    pa.set_memory_pool(pool)
    return pool.backend_name


def run_node(resolved: Resolved) -> int:
    """Serve a node with ``resolved`` settings (federator.settings.from_args) until SIGINT or
    SIGTERM; its exit code. A setting that cannot be used raises ValueError before it joins."""
    from federator.http.app import create_app
    from federator.http.server import serve, shutdown

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("waitress").setLevel(logging.WARNING)
    logging.getLogger(__name__).info("Arrow memory pool: %s", arrow_memory_pool())
    st = resolved.settings
    host, port = _host_port(st.listen, "--listen")
    if st.advertise:
        _host_port(st.advertise, "--advertise")
    _check_ranges(st)
    limits = _limits(st)  # checked before the node joins anything
    users = _users(st, host)
    cluster_secret = _cluster_secret(resolved, host, users)
    tls = from_flags(st.tls_cert, st.tls_key, st.tls_ca)
    if tls is not None and st.server == "waitress":
        raise ValueError("TLS (--tls-cert/--tls-key) is served by granian and loop, not waitress: drop --server "
                         "waitress (or $FEDERATOR_HTTP_SERVER=waitress)")
    # The one registry of this process: built here, owned by the node, passed to the HTTP app.
    registry = load_plugins()
    node = Node(_node_config(st, f"{host}:{port}", cluster_secret, limits, tls), registry)
    # (Node raises PluginsFailed when a plugin failed and --plugin-errors is fatal)
    stopping = threading.Event()
    _stop_on_signals(stopping)
    node.on_refused = lambda why: stopping.set()  # the node logged why; exit with REFUSED
    sql = SqlService(node, registry)
    app = create_app(node, registry, sql, users)
    if st.server != "waitress":
        return _run_in_main(_main_thread_server(st.server, app, sql, host, port, st, stopping, users), node, sql,
                            host, st, stopping, users)
    server = serve(app, host, port, threads=st.threads)
    doors = _start_doors(sql, host, st, users)
    node.start()
    http = threading.Thread(target=server.run, name="http", daemon=True)
    http.start()
    _print_serving(node, host, doors, "waitress")
    _freeze_startup_heap()
    stopping.wait()
    _hand_over(node, doors)
    shutdown(server)
    return _exit_code(node)


def _check_ranges(st: NodeSettings) -> None:
    for name in ("standby_replicas", "scan_cache_mb", "scan_cache_follow", "shard_answers", "reuse_answers_seconds",
                 "statement_answers", "partition_answers_mb", "apply_linger_ms"):
        if getattr(st, name) < 0:
            raise ValueError(f"{BY_NAME[name].flag} must be 0 or more")
    if not 0 <= st.fetch_wait_ms <= MAX_FETCH_WAIT_MS:
        raise ValueError(f"{BY_NAME['fetch_wait_ms'].flag} must be 0 to {MAX_FETCH_WAIT_MS} (the Kafka client's "
                         f"range), got {st.fetch_wait_ms}; 500 suits Apache Kafka, 10 the development broker")


def _node_config(st: NodeSettings, listen: str, cluster_secret: str | None, limits: Limits,
                 tls: Tls | None) -> NodeConfig:
    # resolve() refused a missing application_id or state_dir; main() settled bootstrap_servers
    assert st.application_id is not None and st.bootstrap_servers is not None and st.state_dir is not None
    return NodeConfig(
        bootstrap_servers=st.bootstrap_servers,
        application_id=st.application_id,
        listen=listen,
        advertise=st.advertise,
        state_dir=Path(st.state_dir),
        standby_replicas=st.standby_replicas,
        node_id=st.node_id,
        cluster_secret=cluster_secret,
        duckdb_memory_limit=st.duckdb_memory_limit,
        reuse_answers_seconds=st.reuse_answers_seconds,
        plugin_errors=st.plugin_errors,
        scan_cache_mb=st.scan_cache_mb,  # the node makes its one scan cache from these
        scan_cache_follow=st.scan_cache_follow,
        shard_answers=st.shard_answers,
        statement_answers=st.statement_answers,
        partition_answers_mb=st.partition_answers_mb,
        max_body_bytes=limits.max_body_bytes, max_sql_chars=limits.max_sql_chars,
        max_answer_rows=limits.max_answer_rows, max_answer_bytes=limits.max_answer_bytes,
        max_timeout_ms=limits.max_timeout_ms, max_running_queries=limits.max_running,
        max_queued_queries=limits.max_queued,
        key_port=st.key_port,
        group_timings=GroupTimings(st.session_timeout_ms, st.heartbeat_interval_ms),
        fetch_wait_ms=st.fetch_wait_ms,
        apply_linger_ms=st.apply_linger_ms,
        tls=tls,
    )


def _limits(st: NodeSettings) -> Limits:
    """The limits the settings name (ValueError names a bad one), fitting in --threads."""
    limits = Limits(max_body_bytes=st.max_body_bytes, max_sql_chars=st.max_sql_chars,
                    max_answer_rows=st.max_answer_rows, max_answer_bytes=st.max_answer_bytes,
                    max_timeout_ms=st.max_timeout_ms, max_running=st.max_running_queries,
                    max_queued=st.max_queued_queries)
    limits.check_threads(st.threads)
    return limits


def _exit_code(node: Node) -> int:
    if node.refused is None:
        return 0
    print(f"error: node {node.node_id} refused to serve: {node.refused}", file=sys.stderr, flush=True)
    return REFUSED


def _stop_on_signals(stopping: threading.Event) -> None:
    """SIGINT/SIGTERM set ``stopping``, even while the main thread sleeps in a wait no signal
    interrupts: a signal taken by another thread (granian's Rust threads do not block them)
    only flags the main thread, so the C-level handler's wakeup byte is read here as well."""
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)

    def read_wakeups() -> None:
        with reader, writer:  # held here: a collected writer would close the fd the handler writes to
            while not stopping.is_set():
                data = reader.recv(64)
                if any(sig in (signal.SIGINT, signal.SIGTERM) for sig in data):
                    stopping.set()

    threading.Thread(target=read_wakeups, name="signals", daemon=True).start()


def _start_doors(sql: SqlService, host: str, st: NodeSettings, users: Users | None) -> dict[str, Any]:
    """The front doors besides HTTP the flags ask for: Flight SQL, Postgres. Each binds now, so a
    taken port fails before the node joins."""
    doors: dict[str, Any] = {}
    if st.flight_sql_port is not None:
        from federator.flight import server as flight_server

        doors["flight"] = flight_server.start(sql, host, st.flight_sql_port, users, sql.node.tls)
    if st.pg_port is not None:
        from federator.pgwire import server as pg_server

        doors["pg"] = pg_server.start(sql, host, st.pg_port, users, sql.node.tls)
    return doors


def _users(st: NodeSettings, host: str) -> Users | None:
    """The users of --users-file; without one, the public entries are open, which a node
    allows on a loopback address, or anywhere with --allow-anonymous, and says so."""
    path = st.users_file
    if path:
        users = Users.load(path)  # UsersFileError (a ValueError) names the line
        log.info("public API, console calls and Flight SQL need a bearer token of the %d user(s) in %s",
                 len(users.verifiers), path)
        return users
    if not _is_loopback(host) and not st.allow_anonymous:
        raise ValueError(f"--listen {host} can be reached from other machines and no --users-file names who may "
                         "query this node: add users (`federator users add NAME --users-file FILE`, then "
                         "--users-file FILE), or pass --allow-anonymous to serve anyone")
    log.warning("no --users-file: the public API, console, Flight SQL and Postgres answer anyone who can reach %s%s", host,
                " (loopback only)" if _is_loopback(host) else " (--allow-anonymous)")
    return None


MIN_SECRET_CHARS = 16
_STRENGTH = {FLAG: 0, ENV: 1, FILE: 2}  # the order resolve() takes sources in


def _cluster_secret(resolved: Resolved, host: str, users: Users | None) -> str | None:
    """The cluster secret, from the cluster_secret_file or cluster_secret setting. A node with
    users, or reachable from other machines, must have one: without it the internal endpoints and
    the key port would hand out every row to anyone who asks."""
    path, given = _secret_source(resolved)
    if path:
        try:
            secret: str | None = Path(path).read_text(encoding="utf-8").strip()
        except OSError as e:
            raise ValueError(f"cannot read --cluster-secret-file {path!r}: {e.strerror}") from None
    else:
        if given and resolved.sources["cluster_secret"] == FLAG:
            log.warning("--cluster-secret shows the secret to anyone who can run `ps` here: "
                        "prefer --cluster-secret-file FILE or $%s", BY_NAME["cluster_secret"].meta.env)
        secret = given
    make = f"make one with `openssl rand -hex 32 > FILE` and start every node with --cluster-secret-file FILE"
    if not secret:
        why = "has users (--users-file)" if users is not None else f"listens on {host}, which other machines can reach"
        if users is not None or not _is_loopback(host):
            raise ValueError(f"this node {why} and so needs a cluster secret, which node-to-node calls (/internal/ "
                             f"and the key port) must carry: {make} (or set ${BY_NAME['cluster_secret'].meta.env})")
        return None
    if len(secret) < MIN_SECRET_CHARS:
        raise ValueError(f"the cluster secret has {len(secret)} characters, fewer than {MIN_SECRET_CHARS}: {make}")
    return secret


def _secret_source(resolved: Resolved) -> tuple[str | None, str | None]:
    """(file, secret), at most one of them: the one from the stronger source, the file when both
    are in the environment; both as flags, or both in the file, is an error."""
    st, sources = resolved.settings, resolved.sources
    path, given = st.cluster_secret_file, st.cluster_secret
    if not (path and given):
        return path, given
    of_file, of_secret = sources["cluster_secret_file"], sources["cluster_secret"]
    if of_file == of_secret != ENV:
        where = "flags" if of_file == FLAG else "--config file"
        raise ValueError(f"pass the cluster secret once: cluster_secret_file or cluster_secret, not both ({where})")
    return (None, given) if _STRENGTH[of_secret] < _STRENGTH[of_file] else (path, None)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _freeze_startup_heap() -> None:
    """Leave what the node made to start (its modules: DuckDB, pyarrow, sqlglot, Flask, ...)
    out of every later garbage collection. A full collection otherwise walks all of it, holding
    the GIL for several times longer than a quick query takes (the leaderboard's rank runs,
    tests/bench/results.md). Objects made later are collected as before."""
    gc.collect()
    gc.freeze()


def _print_serving(node: Node, host: str, doors: dict[str, Any], server: str) -> None:
    http, grpc = ("https", "grpc+tls") if node.tls else ("http", "grpc")
    print(f"node {node.node_id} serving {http}://{node.endpoint} on {server} (state in {node.state_dir})", flush=True)
    if "flight" in doors:
        print(f"node {node.node_id} serving Flight SQL on {grpc}://{host}:{doors['flight'].port}", flush=True)
    if "pg" in doors:
        ssl = "?sslmode=require" if node.tls else ""
        print(f"node {node.node_id} serving Postgres on postgresql://{host}:{doors['pg'].port}/federator{ssl}", flush=True)


def _hand_over(node: Node, doors: dict[str, Any]) -> None:
    logging.getLogger(__name__).info("stopping: handing partitions over")
    if "flight" in doors:
        from federator.flight import server as flight_server

        flight_server.stop(doors["flight"])  # external clients only: stop them before the handover
    if "pg" in doors:
        doors["pg"].stop()
    node.stop()


def _main_thread_server(name: str, app: Any, sql: SqlService, host: str, port: int, st: NodeSettings,
                        stopping: threading.Event, users: Users | None) -> Any:
    """The server `--server` names that runs in the main thread: granian, or the asyncio loop."""
    if name == "loop":
        from federator.http.loop_answers import LoopAnswers
        from federator.http.loop_server import LoopServer

        server = LoopServer(app, host, port, threads=st.threads, on_signal=stopping.set, tls=sql.node.tls,
                            front=LoopAnswers(sql, users))
        sql.node.materializer.apply_on(server.run_on_loop)  # small fetches applied between the loop's answers
        return server
    from federator.http.granian_server import GranianServer

    return GranianServer(app, host, port, threads=st.threads, on_signal=stopping.set, tls=sql.node.tls)


def _run_in_main(server: Any, node: Node, sql: SqlService, host: str, st: NodeSettings,
                 stopping: threading.Event, users: Users | None) -> int:
    """The server runs in the main thread (it sets signal handlers as it starts); a second
    thread keeps the shutdown order of the waitress path: hand over, then stop serving."""
    doors = _start_doors(sql, host, st, users)
    node.start()

    def stop_in_order() -> None:
        while not (server.listening.wait(0.1) or stopping.is_set()):
            pass
        if server.listening.is_set():
            _print_serving(node, host, doors, st.server)
            _freeze_startup_heap()
        stopping.wait()
        _hand_over(node, doors)
        server.stop()

    stopper = threading.Thread(target=stop_in_order, name="stopper")
    stopper.start()
    try:
        server.run()
    finally:
        stopping.set()  # the server ended on its own (a bind error): still hand over
        stopper.join()
    return _exit_code(node)
