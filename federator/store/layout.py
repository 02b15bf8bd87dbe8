"""Changelog key layouts of windowed and session stores (Kafka Streams' binary layouts).

- window:  key bytes + 8-byte big-endian window start + 4-byte big-endian seqnum
- session: key bytes + 8-byte big-endian session end + 8-byte big-endian session start
Both are partitioned by the plain key bytes.
"""

from __future__ import annotations

import struct

_WINDOW_SUFFIX = struct.Struct(">qi")
_SESSION_SUFFIX = struct.Struct(">qq")
WINDOW_SUFFIX_LEN = _WINDOW_SUFFIX.size
SESSION_SUFFIX_LEN = _SESSION_SUFFIX.size
MAX_TIME = (1 << 63) - 1


class LayoutError(ValueError):
    pass


def window_key(key: bytes, window_start: int, seqnum: int = 0) -> bytes:
    return key + _WINDOW_SUFFIX.pack(window_start, seqnum)


def split_window_key(data: bytes) -> tuple[bytes, int, int]:
    """(key bytes, window start, seqnum)."""
    if len(data) < WINDOW_SUFFIX_LEN:
        raise LayoutError(f"window changelog key has {len(data)} bytes, needs at least {WINDOW_SUFFIX_LEN}")
    start, seq = _WINDOW_SUFFIX.unpack_from(data, len(data) - WINDOW_SUFFIX_LEN)
    return data[:-WINDOW_SUFFIX_LEN], start, seq


def session_key(key: bytes, session_start: int, session_end: int) -> bytes:
    return key + _SESSION_SUFFIX.pack(session_end, session_start)


def split_session_key(data: bytes) -> tuple[bytes, int, int]:
    """(key bytes, session start, session end)."""
    if len(data) < SESSION_SUFFIX_LEN:
        raise LayoutError(f"session changelog key has {len(data)} bytes, needs at least {SESSION_SUFFIX_LEN}")
    end, start = _SESSION_SUFFIX.unpack_from(data, len(data) - SESSION_SUFFIX_LEN)
    return data[:-SESSION_SUFFIX_LEN], start, end


def time_bytes(t: int) -> bytes:
    return struct.pack(">q", t)
