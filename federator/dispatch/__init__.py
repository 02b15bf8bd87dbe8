"""Calling nodes: the internal per-partition query call over pooled keep-alive HTTP."""

from federator.dispatch.client import NodeCallError, NodeClient

__all__ = ["NodeCallError", "NodeClient"]
