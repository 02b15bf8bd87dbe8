"""`federator node`: a node and its HTTP server in one process, until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path

from federator.node.node import Node, NodeConfig


def _host_port(text: str, flag: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{flag} must be HOST:PORT, got {text!r}")
    return host or "0.0.0.0", int(port)


def run_node(args: argparse.Namespace) -> int:
    from federator.http.app import create_app
    from federator.http.server import serve, shutdown

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("waitress").setLevel(logging.WARNING)
    host, port = _host_port(args.listen, "--listen")
    if args.advertise:
        _host_port(args.advertise, "--advertise")
    if args.standby_replicas < 0:
        raise ValueError("--standby-replicas must be 0 or more")
    node = Node(NodeConfig(
        bootstrap_servers=args.bootstrap_servers,
        application_id=args.application_id,
        listen=f"{host}:{port}",
        advertise=args.advertise,
        state_dir=Path(args.state_dir),
        standby_replicas=args.standby_replicas,
        node_id=args.node_id,
        cluster_secret=args.cluster_secret,
    ))
    if args.scan_cache_mb < 0:
        raise ValueError("--scan-cache-mb must be 0 or more")
    from federator.store.scan_cache import SCAN_CACHE

    SCAN_CACHE.max_bytes = args.scan_cache_mb << 20
    server = serve(create_app(node), host, port, threads=args.threads)
    stopping = threading.Event()

    def on_signal(*_: object) -> None:
        stopping.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    flight_sql = None
    if getattr(args, "flight_sql_port", None) is not None:
        from federator.flight import server as flight_server

        flight_sql = flight_server.start(node, host, args.flight_sql_port)  # binds now: a taken port fails early
    node.start()
    http = threading.Thread(target=server.run, name="http", daemon=True)
    http.start()
    print(f"node {node.node_id} serving http://{node.endpoint} (state in {node.state_dir})", flush=True)
    if flight_sql is not None:
        print(f"node {node.node_id} serving Flight SQL on grpc://{host}:{flight_sql.port}", flush=True)
    stopping.wait()
    logging.getLogger(__name__).info("stopping: handing partitions over")
    if flight_sql is not None:
        flight_server.stop(flight_sql)  # external clients only: stop them before the handover
    node.stop()
    shutdown(server)
    return 0
