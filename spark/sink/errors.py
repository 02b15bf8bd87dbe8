"""The sink's error for input it cannot write."""

from __future__ import annotations


class SinkError(ValueError):
    """The DataFrame or the arguments cannot be written as asked; nothing was written."""
