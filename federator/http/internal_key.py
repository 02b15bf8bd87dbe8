"""The owner's end of the point lookup's node-to-node call (federator.query.wire.KEY_PATH).

A routed point lookup needs one key's stored bytes from the partition's owner: the receiver
decodes them as it decodes its own (federator.sql.point). Answered before Flask, and with no
JSON or Arrow either way, so the second hop costs about one loopback HTTP round trip."""

from __future__ import annotations

import hmac
from typing import Any, Callable, Protocol

from federator.query.position import Position, PositionBound
from federator.query.wire import KEY_PATH, OFFSET_HEADER, SECRET_HEADER, parse_key_path
from federator.store.layer import StoredEntry

_UNBOUNDED = PositionBound.unbounded()
_SECRET_ENVIRON = "HTTP_" + SECRET_HEADER.upper().replace("-", "_")


class KeyNode(Protocol):
    cluster_secret: str | None
    stores: dict[str, Any]

    def read_local(self, store: str, partition: int, key: bytes, bound: PositionBound) -> StoredEntry | None: ...


class InternalKeyPath:
    """WSGI middleware: answers GET KEY_PATH...; everything else (and a call without the
    right secret, which the app refuses with its 403 naming the header) goes on to the app."""

    def __init__(self, app: Callable[..., Any], node: KeyNode) -> None:
        self.app, self.node = app, node

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        path = environ.get("PATH_INFO", "")
        if not path.startswith(KEY_PATH) or environ.get("REQUEST_METHOD") != "GET":
            return self.app(environ, start_response)
        secret = self.node.cluster_secret
        if secret and not hmac.compare_digest(environ.get(_SECRET_ENVIRON, "").encode("latin-1"), secret.encode()):
            return self.app(environ, start_response)
        parsed = parse_key_path(path)
        defn = self.node.stores.get(parsed[0]) if parsed is not None else None
        if parsed is None or defn is None:
            return self.app(environ, start_response)  # the app's 404 names what there is
        store, partition, key = parsed
        at = environ.get("QUERY_STRING", "")
        try:
            bound = PositionBound.at(Position.of(defn.topic, partition, int(at[3:]))) if at.startswith("at=") else _UNBOUNDED
        except ValueError:
            return self.app(environ, start_response)
        entry = self.node.read_local(store, partition, key, bound)
        if entry is None:
            start_response("409 Conflict", [("Content-Length", "0")])
            return [b""]
        offset = entry.position.get(defn.topic, partition)
        headers = [(OFFSET_HEADER, "" if offset is None else str(offset))]
        if entry.stored is None:
            start_response("204 No Content", headers)
            return [b""]
        start_response("200 OK", [*headers, ("Content-Type", "application/octet-stream"),
                                  ("Content-Length", str(len(entry.stored)))])
        return [entry.stored]
