"""What is made once per set of argument objects (a plan's schemas and steps), found by the
objects' identity before their value."""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Callable, TypeVar

T = TypeVar("T")


def by_identity(build: Callable[..., T], most: int = 256, by_value: bool = True) -> Callable[..., T]:
    """``build(*args)`` made once per argument objects: found by their identity first (the
    same objects answer every query of a plan), then by their value (hashing a pyarrow schema
    walks its fields, a few µs: as much as the rest of a one-row answer); ``by_value`` False
    for arguments that cannot be hashed (a plan), found by identity alone. An entry holds its
    arguments, so no other object takes their ids while it is kept."""
    made_anew = lru_cache(maxsize=most)(build) if by_value else build
    by_object: dict[tuple[int, ...], tuple[tuple[Any, ...], T]] = {}

    def made(*args: Any) -> T:
        held = by_object.get(tuple(map(id, args)))
        if held is not None:
            return held[1]
        value = made_anew(*args)
        if len(by_object) >= most:
            by_object.clear()
        by_object[tuple(map(id, args))] = (args, value)
        return value
    return made
