"""The console at ``/``: a page that runs SQL, browses stores and draws the cluster map.

Its files ship in the package (``federator/http/console/``) and are served by the node
itself, so it works offline and needs nothing but a browser. The page speaks the same
public API as any client (``POST /v1/sql``, ``GET /v1/stores``, ``GET /v1/metadata``).
"""

from __future__ import annotations

from importlib import resources

from flask import Flask, Response

from federator.errors import SqlError
from federator.http.errors import error_response

# the only files served: a fixed table, so no request path reaches the file system
ASSETS = {
    "index.html": "text/html; charset=utf-8",
    "console.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
}


def _asset(name: str) -> bytes:
    return resources.files("federator.http").joinpath("console", name).read_bytes()


def register_console(app: Flask) -> None:
    files = {name: _asset(name) for name in ASSETS}  # read once: they are part of the package

    def serve(name: str) -> Response:
        # no-cache: a node upgraded in place serves its new console on the next load
        return Response(files[name], content_type=ASSETS[name], headers={"Cache-Control": "no-cache"})

    @app.get("/")
    def console() -> Response:
        return serve("index.html")

    @app.get("/console/<name>")
    def console_asset(name: str) -> Response:
        if name not in files:
            return error_response(SqlError("NOT_FOUND", f"no console file {name!r}; open / for the console"))
        return serve(name)
