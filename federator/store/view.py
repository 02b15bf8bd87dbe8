"""What a store type sees of a shard: point gets and bounded scans of its RocksDB column
families. Apart from the shard, so store types can name it without importing the shard,
which imports them."""

from __future__ import annotations

import itertools
import operator
from typing import Any, Callable, Iterable, Iterator, TypeVar

import pyarrow as pa
from rocksdict import Rdict, ReadOptions

from federator.catalog.definition import StoreDefinition
from federator.query.position import Position

T = TypeVar("T")


class ShardView:
    """What store types read and write through: point gets and bounded scans of one shard,
    in its default column family or one the store type declared."""

    __slots__ = ("definition", "schema", "partition", "memory", "_position", "_db", "_families", "_bounds", "_keep")

    def __init__(self, definition: StoreDefinition, schema: pa.Schema, partition: int, db: Rdict,
                 families: dict[str, tuple[Rdict, Any]] | None = None,
                 keep: Callable[[str, Callable[[], Any]], Any] | None = None, memory: Any = None,
                 position: Position | None = None) -> None:
        self.definition = definition
        self.memory = memory  # what the store type keeps of the shard in memory (StoreType.memory)
        self._position = position  # the shard's when the view was made (its offset read only if asked)
        self.schema = schema
        self.partition = partition
        self._db = db
        self._families = families or {}
        self._keep = keep
        # RocksDB keeps a pointer to an iterator's upper bound, not a copy: the bytes (and the
        # options) must outlive the scan, or a caller's temporary bound turns into garbage
        # mid-scan. A view a scan used is not shared again (Shard._view_to_read): it keeps them
        # for as long as that read holds it.
        self._bounds: list[Any] = []

    @property
    def scanned(self) -> bool:
        """Whether a scan has used this view (it keeps that scan's bounds)."""
        return bool(self._bounds)

    @property
    def offset(self) -> int | None:
        """The shard's last applied offset when the view was made (None: none yet)."""
        return None if self._position is None else self._position.get(self.definition.topic, self.partition)

    def _declared(self, family: str) -> tuple[Rdict, Any]:
        try:
            return self._families[family]
        except KeyError:
            raise KeyError(
                f"column family {family!r} is not declared by store type {self.definition.type!r}; "
                "list it in the StoreType's column_families"
            ) from None

    def _family(self, family: str | None) -> Rdict:
        return self._db if family is None else self._declared(family)[0]

    def handle(self, family: str) -> Any:
        """What to pass as ``column_family`` to ``WriteBatch.put/delete`` for a declared family."""
        return self._declared(family)[1]

    def kept(self, name: str, build: Callable[[], T]) -> T:
        """``build()``, kept by the shard under ``name`` until its next write (Shard.kept), so
        a handler can answer from what it derived of unchanged data; without a shard to keep
        it (a view over a bare database), built each time."""
        return build() if self._keep is None else self._keep(name, build)

    def get(self, key: bytes, family: str | None = None) -> bytes | None:
        return self._family(family).get(key)

    def scan(self, start: bytes | None = None, stop: bytes | None = None, reverse: bool = False,
             family: str | None = None, fill_cache: bool = True) -> Iterator[tuple[bytes, bytes]]:
        """Entries with start <= key < stop in byte order (or reversed). ``fill_cache=False``
        for a bulk scan: the blocks it reads do not enter RocksDB's block cache."""
        db = self._family(family)
        ro = ReadOptions()
        if not fill_cache:
            ro.fill_cache(False)
        if stop is not None:
            ro.set_iterate_upper_bound(stop)
            self._bounds.append((ro, stop))
        # rocksdict honours the upper bound natively but not the lower one: seek to it going
        # forward, and stop at it by hand going backward.
        if not reverse:
            items = db.items(read_opt=ro) if start is None else db.items(from_key=start, read_opt=ro)
        else:
            items = db.items(backwards=True, read_opt=ro)
            if start is not None:
                items = itertools.takewhile(lambda kv: kv[0] >= start, items)
        return iter(items)


_bounds_of = operator.attrgetter("_bounds")


def any_scanned(views: Iterable[ShardView]) -> bool:
    """Whether a scan has used any of ``views``: ``scanned`` for many, with no Python call a view."""
    return any(map(_bounds_of, views))
