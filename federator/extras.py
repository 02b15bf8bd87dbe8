"""The installed distribution's extras: which packages each needs, and which of those are missing.

`pip install federator` is the client alone (the DB-API driver, the SQLAlchemy dialect, `federator
sql`); the node, the Spark side and the development broker are extras. Their requirements are read
from the installed distribution's metadata, so setup.cfg stays the one place that lists them.
"""

from __future__ import annotations

import re
from importlib import metadata

DISTRIBUTION = "federator"
_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?")
_EXTRA = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")


def requirements(extra: str) -> list[str]:
    """The distribution names ``extra`` requires, those of the extras it names included; none
    when Federator runs from a source tree without its metadata (nothing to check then)."""
    try:
        declared = metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        return []
    names: list[str] = []
    for line in declared:
        spec, _, marker = line.partition(";")
        found = _EXTRA.search(marker)
        m = _NAME.match(spec)
        if found is None or found.group(1) != extra or m is None:
            continue
        if m.group(1).lower() == DISTRIBUTION:  # federator[node] inside another extra
            names += [n for e in (m.group(2) or "").split(",") if e.strip() for n in requirements(e.strip())]
        else:
            names.append(m.group(1))
    return names


def missing(extra: str) -> list[str]:
    """The packages of ``extra`` that are not installed."""
    absent = []
    for name in requirements(extra):
        try:
            metadata.version(name)
        except metadata.PackageNotFoundError:
            absent.append(name)
    return sorted(set(absent))
