"""Calling nodes: the internal per-partition query call over pooled keep-alive HTTP, and the
dispatcher that fans a query out to the owners. Its failures are its own (``errors``)."""

from federator.dispatch.client import NodeCallError, NodeClient
from federator.dispatch.errors import DispatchError

__all__ = ["DispatchError", "NodeCallError", "NodeClient"]
