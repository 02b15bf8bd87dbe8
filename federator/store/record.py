"""A changelog record as the store applies it."""

from __future__ import annotations

from typing import NamedTuple


class ChangelogRecord(NamedTuple):
    key: bytes  # the changelog record key, in the store type's layout
    value: bytes | None  # None = tombstone (delete)
    offset: int
    timestamp: int  # epoch ms of the record
