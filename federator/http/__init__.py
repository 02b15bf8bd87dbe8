"""HTTP front of a node: the Flask app (public and internal endpoints) and the waitress server."""

from federator.http.app import create_app
from federator.http.server import bound_port, serve, shutdown, start

__all__ = ["bound_port", "create_app", "serve", "shutdown", "start"]
