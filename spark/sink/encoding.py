"""A task's columns as the bytes it produces (worker side): keys and values by their formats'
own vectorized encoders (``Format.encode_array``), and binary columns as the Python bytes the
producer takes. Changelog keys are laid out by ``federator.store.layout.changelog_keys``."""

from __future__ import annotations

import pyarrow as pa

from federator.formats import Format


def encode(column: pa.Array, fmt: Format | None) -> pa.Array:
    """A column (no nulls) as the bytes of ``fmt``: a binary or fixed-size binary array. None:
    the column holds the bytes already (a JSON document that Spark built with to_json)."""
    if fmt is None:
        return column.cast(pa.binary())
    return fmt.encode_array(column)


def bytes_list(arr: pa.Array) -> list[bytes]:
    """A binary or fixed-size binary array (no nulls) as a list of bytes objects. Fixed-size
    goes through numpy: pyarrow's to_pylist of fixed-size binary is ~15x slower."""
    if pa.types.is_fixed_size_binary(arr.type):
        import numpy as np

        width = arr.type.byte_width
        return np.frombuffer(arr.buffers()[1], dtype=f"V{width}", count=len(arr),
                             offset=arr.offset * width).tolist()
    return arr.to_pylist()
