"""HTTP front of a node: the Flask app (public and internal endpoints) and its servers.

Names load on first use (PEP 562), so commands that only build their parser (``federator
store ...``) do not pay for importing Flask and the servers."""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"create_app": "federator.http.app", "bound_port": "federator.http.server", "serve": "federator.http.server",
            "shutdown": "federator.http.server", "start": "federator.http.server"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
