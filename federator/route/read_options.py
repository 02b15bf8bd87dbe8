"""How fresh a read must be and how long it may take: one record per SQL request, read by
routing (which copies may answer) and dispatch (what the owners must have reached, and when
to give up)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from federator.query.position import PositionBound


@dataclass(frozen=True)
class ReadOptions:
    # what the owners must have applied (a consistency token's offsets), unbounded by default
    bound: PositionBound = field(default_factory=PositionBound.unbounded)
    allow_stale: bool = False  # a standby may answer
    max_lag: int | None = None  # ... if it is no more than this many records behind
    deadline: float = math.inf  # time.monotonic() by which every partition must have answered
    # answered by the copies as they are now, or not at all (NotNow): for the event loop, which
    # must not wait for a copy to catch up
    at_once: bool = False
