"""A client for one node's internal query endpoint."""

from __future__ import annotations

import json

import urllib3

from federator.tls import Tls

from federator.query.request import StateQueryRequest
from federator.query.result import QueryResult
from federator.query.wire import MEDIA_TYPE, SECRET_HEADER, decode_results

_POOL = urllib3.PoolManager(maxsize=16, retries=False)
_TLS_POOLS: dict[int, urllib3.PoolManager] = {}  # id(Tls) -> its pool: one per node's TLS settings


def _pool(tls: Tls | None) -> urllib3.PoolManager:
    if tls is None:
        return _POOL
    pool = _TLS_POOLS.get(id(tls))
    if pool is None:
        pool = _TLS_POOLS[id(tls)] = urllib3.PoolManager(maxsize=16, retries=False, ssl_context=tls.client)
    return pool


class NodeCallError(RuntimeError):
    """The node did not answer, or answered with an error instead of per-partition results."""

    def __init__(self, endpoint: str, message: str, status: int | None = None, code: str | None = None) -> None:
        super().__init__(f"node {endpoint}: {message}")
        self.endpoint, self.status, self.code = endpoint, status, code


class NodeClient:
    def __init__(self, endpoint: str, cluster_secret: str | None = None, timeout: float = 10.0,
                 tls: Tls | None = None) -> None:
        """``tls``: the calling node's; with it the call goes over https and the peer's
        certificate is checked (the cluster secret never crosses the network in clear)."""
        self.endpoint = endpoint
        self.base = endpoint if endpoint.startswith("http") else f"{'https' if tls else 'http'}://{endpoint}"
        self._pool = _pool(tls)
        self.headers = {"Content-Type": "application/json", "Accept": MEDIA_TYPE}
        if cluster_secret:
            self.headers[SECRET_HEADER] = cluster_secret
        self.timeout = timeout

    def query(self, request: StateQueryRequest, timeout: float | None = None) -> list[QueryResult]:
        """One call carrying every partition of ``request``; per-partition failures come back as results."""
        try:
            resp = self._pool.request(
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

    def get_json(self, path: str, timeout: float | None = None) -> tuple[int, dict]:
        try:
            resp = self._pool.request("GET", f"{self.base}{path}", timeout=timeout or self.timeout)
        except urllib3.exceptions.HTTPError as e:
            raise NodeCallError(self.endpoint, f"no answer ({type(e).__name__}: {e})") from None
        return resp.status, json.loads(resp.data)
