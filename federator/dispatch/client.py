"""A client for one node's internal query endpoint."""

from __future__ import annotations

import http.client
import json
import threading
from urllib.parse import urlsplit

import urllib3

from federator.query.position import Position
from federator.query.request import StateQueryRequest
from federator.query.result import QueryResult
from federator.query.wire import MEDIA_TYPE, OFFSET_HEADER, SECRET_HEADER, decode_results, key_path
from federator.store.layer import StoredEntry

_POOL = urllib3.PoolManager(maxsize=16, retries=False)


class NodeCallError(RuntimeError):
    """The node did not answer, or answered with an error instead of per-partition results."""

    def __init__(self, endpoint: str, message: str, status: int | None = None, code: str | None = None) -> None:
        super().__init__(f"node {endpoint}: {message}")
        self.endpoint, self.status, self.code = endpoint, status, code


class NodeClient:
    def __init__(self, endpoint: str, cluster_secret: str | None = None, timeout: float = 10.0) -> None:
        self.endpoint = endpoint
        self.base = endpoint if endpoint.startswith("http") else f"http://{endpoint}"
        self.headers = {"Content-Type": "application/json", "Accept": MEDIA_TYPE}
        if cluster_secret:
            self.headers[SECRET_HEADER] = cluster_secret
        self.timeout = timeout
        # the point lookup's call: one kept-alive connection per thread, on http.client, which
        # costs a fraction of urllib3's pool per request (a round trip here is ~100 us)
        self._local = threading.local()
        url = urlsplit(self.base)
        self._host, self._port = url.hostname or "127.0.0.1", url.port or 80
        self._key_headers = {SECRET_HEADER: cluster_secret} if cluster_secret else {}

    def query(self, request: StateQueryRequest, timeout: float | None = None) -> list[QueryResult]:
        """One call carrying every partition of ``request``; per-partition failures come back as results."""
        try:
            resp = _POOL.request(
                "POST", f"{self.base}/internal/v1/query", body=json.dumps(request.to_dict()).encode(),
                headers=self.headers, timeout=timeout or self.timeout,
            )
        except urllib3.exceptions.HTTPError as e:
            raise NodeCallError(self.endpoint, f"no answer ({type(e).__name__}: {e})") from None
        if resp.status != 200:
            try:
                err = json.loads(resp.data)["error"]
                code, message = err["code"], err["message"]
            except (ValueError, KeyError, TypeError):
                code, message = None, resp.data[:200].decode("utf-8", "replace")
            raise NodeCallError(self.endpoint, f"HTTP {resp.status} {code}: {message}", resp.status, code)
        return decode_results(resp.data)

    def read_key(self, store: str, topic: str, partition: int, key: bytes, at: int | None,
                 timeout: float) -> StoredEntry | None:
        """``key``'s stored entry from the node's active, current copy of the partition (at
        least at offset ``at``), as ``Node.read_local`` gives it here; None when the node
        cannot answer it so, or does not answer: the caller takes the general path, which
        retries elsewhere and says why when it cannot."""
        path = key_path(store, partition, key) + ("" if at is None else f"?at={at}")
        for attempt in (0, 1):  # a kept-alive connection the node closed fails once: open another
            conn = getattr(self._local, "conn", None)
            if conn is None:
                conn = self._local.conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
            try:
                if conn.sock is not None:
                    conn.sock.settimeout(timeout)
                conn.request("GET", path, headers=self._key_headers)
                resp = conn.getresponse()
                body = resp.read()
            except TimeoutError:  # not again: the time is spent
                conn.close()
                self._local.conn = None
                return None
            except (OSError, http.client.HTTPException):
                conn.close()
                self._local.conn = None
                if attempt:
                    return None
                continue
            if resp.status not in (200, 204):
                return None
            offset = resp.getheader(OFFSET_HEADER)
            position = Position.of(topic, partition, int(offset)) if offset else Position()
            return StoredEntry(body if resp.status == 200 else None, position)
        return None

    def get_json(self, path: str, timeout: float | None = None) -> tuple[int, dict]:
        try:
            resp = _POOL.request("GET", f"{self.base}{path}", timeout=timeout or self.timeout)
        except urllib3.exceptions.HTTPError as e:
            raise NodeCallError(self.endpoint, f"no answer ({type(e).__name__}: {e})") from None
        return resp.status, json.loads(resp.data)
