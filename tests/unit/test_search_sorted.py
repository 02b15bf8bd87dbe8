"""Finding keys in a scan's sorted key column by binary search gives each key's row, or none,
for every key type a kv scan is sorted by (bytes order for strings and bytes, value order for
integers), sliced or not, and whatever the needles."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from federator.store.arrow import search_sorted

TYPES = {
    "string": (pa.string(), st.text(max_size=5)),
    "large_string": (pa.large_string(), st.text(max_size=5)),
    "binary": (pa.binary(), st.binary(max_size=5)),
    "int64": (pa.int64(), st.integers(-(1 << 63), (1 << 63) - 1)),
    "int32": (pa.int32(), st.integers(-(1 << 31), (1 << 31) - 1)),
}


def _order(v: object) -> object:
    return v.encode() if isinstance(v, str) else v  # strings sort by their UTF-8 bytes in a scan


@settings(max_examples=60, deadline=None)
@given(data=st.data(), name=st.sampled_from(sorted(TYPES)))
def test_each_needle_is_found_at_its_row_or_not_at_all(data, name: str) -> None:
    arrow_type, values = TYPES[name]
    keys = sorted(set(data.draw(st.lists(values, max_size=40))), key=_order)
    start = data.draw(st.integers(0, len(keys)))
    ordered = pa.array(keys, arrow_type).slice(start)  # a slice: its offsets start past zero
    some = st.one_of(values, st.sampled_from(keys)) if keys else values
    needles = data.draw(st.lists(st.one_of(st.none(), some) if data.draw(st.booleans()) else some, max_size=10))
    got = search_sorted(pa.array(needles, arrow_type), ordered).to_pylist()
    rows = ordered.to_pylist()
    assert got == [rows.index(n) if n is not None and n in rows else None for n in needles]
