"""Changelog key layouts of windowed and session stores (Kafka Streams' binary layouts).

- window:  key bytes + 8-byte big-endian window start + 4-byte big-endian seqnum
- session: key bytes + 8-byte big-endian session end + 8-byte big-endian session start
Both are partitioned by the plain key bytes. A kv store's changelog key is the plain key.

One key at a time (``window_key``, ``split_window_key``, ...) for the stores; a whole Arrow
column at a time (``changelog_keys``) for writers that lay out many keys at once (the Spark
sink). Both are built from the suffix layouts defined here, next to each other.
"""

from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from federator.errors import FederatorError

_WINDOW_SUFFIX = struct.Struct(">qi")
_SESSION_SUFFIX = struct.Struct(">qq")
# The same suffixes as numpy record types (fields in byte order), for many keys at once.
_WINDOW_SUFFIX_ROWS = np.dtype([("start", ">i8"), ("seqnum", ">i4")])
_SESSION_SUFFIX_ROWS = np.dtype([("end", ">i8"), ("start", ">i8")])
WINDOW_SUFFIX_LEN = _WINDOW_SUFFIX.size
SESSION_SUFFIX_LEN = _SESSION_SUFFIX.size
MAX_TIME = (1 << 63) - 1
# A stored value (the shard's, every store type's): the record's rowtime as an 8-byte
# big-endian count of epoch milliseconds, then the value bytes.
ROWTIME = struct.Struct(">q")
ROWTIME_LEN = ROWTIME.size

# A store type's ``changelog_layout`` -> bytes its changelog keys carry after the plain key.
SUFFIX_LEN = {"kv": 0, "window": WINDOW_SUFFIX_LEN, "session": SESSION_SUFFIX_LEN}


class LayoutError(FederatorError, ValueError):
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
    return ROWTIME.pack(t)


def plain_key(layout: str, key: bytes) -> bytes:
    """The plain key of a changelog key in ``layout`` (kv, window or session): what the
    record is partitioned by."""
    cut = _suffix_len(layout)
    return key[: len(key) - cut]


# ---- many keys at once (Arrow columns) ---------------------------------------------------
def _suffix_len(layout: str) -> int:
    try:
        return SUFFIX_LEN[layout]
    except KeyError:
        raise LayoutError(f"changelog layout {layout!r} is not one of {', '.join(SUFFIX_LEN)}") from None


def _times(values: pa.Array | np.ndarray) -> np.ndarray:
    return values.to_numpy(zero_copy_only=False) if isinstance(values, pa.Array) else np.asarray(values)


def _with_suffixes(keys: pa.Array, suffixes: np.ndarray) -> pa.Array:
    """Each key followed by its row of ``suffixes``: one binary array."""
    width = suffixes.dtype.itemsize
    tail = pa.Array.from_buffers(pa.binary(width), len(keys), [None, pa.py_buffer(suffixes.tobytes())])
    return pc.binary_join_element_wise(keys.cast(pa.binary()), tail.cast(pa.binary()), b"")


def window_keys(keys: pa.Array, starts: pa.Array | np.ndarray, seqnum: int = 0) -> pa.Array:
    """``window_key`` of every key (binary, no nulls) with its window start (int64, epoch ms)."""
    suffixes = np.zeros(len(keys), dtype=_WINDOW_SUFFIX_ROWS)
    suffixes["start"] = _times(starts)
    suffixes["seqnum"] = seqnum
    return _with_suffixes(keys, suffixes)


def session_keys(keys: pa.Array, starts: pa.Array | np.ndarray, ends: pa.Array | np.ndarray) -> pa.Array:
    """``session_key`` of every key (binary, no nulls) with its session start and end (epoch ms)."""
    suffixes = np.zeros(len(keys), dtype=_SESSION_SUFFIX_ROWS)
    suffixes["end"], suffixes["start"] = _times(ends), _times(starts)
    return _with_suffixes(keys, suffixes)


def changelog_keys(layout: str, keys: pa.Array, start: pa.Array | None = None,
                   end: pa.Array | None = None) -> pa.Array:
    """The changelog keys of plain ``keys`` (binary or fixed-size binary, no nulls) in
    ``layout``: kv keys as they are; window keys with ``start`` (the window starts) and
    seqnum 0; session keys with ``start`` and ``end``."""
    _suffix_len(layout)
    if layout == "kv":
        return keys
    if start is None or (layout == "session" and end is None):
        raise LayoutError(f"{layout} changelog keys need " + ("start and end times" if layout == "session"
                                                               else "window start times"))
    return window_keys(keys, start) if layout == "window" else session_keys(keys, start, end)
