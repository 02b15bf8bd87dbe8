"""Which HTTP server a node runs: the names and the default, without importing either server, so
that `federator --help` lists them in an install without the node's dependencies."""

from __future__ import annotations

import os

SERVERS = ("granian", "waitress")


def default_server() -> str:
    """The HTTP server `federator node` uses unless told otherwise: $FEDERATOR_HTTP_SERVER,
    else granian."""
    chosen = os.environ.get("FEDERATOR_HTTP_SERVER", "granian")
    if chosen not in SERVERS:
        raise ValueError(f"FEDERATOR_HTTP_SERVER must be one of {', '.join(SERVERS)}, got {chosen!r}")
    return chosen
