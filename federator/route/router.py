"""Partition → node, from the membership view; standbys when stale reads are allowed, or when a
consistency token asks for no more than a standby already has. A global store's partitions go
to no other node: the node asked answers them from its own copies (``local_refusals``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from federator.cluster.membership import ClusterView
from federator.route.read_options import ReadOptions


@dataclass(frozen=True)
class Target:
    node_id: str
    endpoint: str
    active: bool
    key_endpoint: str | None = None  # where it takes the point lookup's call, if it does


def targets_for(view: ClusterView, store: str, partition: int, options: ReadOptions,
                avoid: frozenset[str] = frozenset(), at_least: int | None = None) -> list[Target]:
    """Where to ask, best first.

    The active owner. With ``options.allow_stale``, then the standbys within ``max_lag`` (least lag
    first). Without it, a standby is asked only for a read whose consistency token names this
    partition (``at_least``: the changelog offset the token asks for) and only while the active
    owner cannot answer (none in the view, in ``avoid`` because it failed, or still restoring
    the partition): the standbys whose published position has reached ``at_least``, most
    advanced first. Such a read is not stale, since the token asks for no more (Kafka Streams
    serves a PositionBound from standbys the same way); the owner that serves it checks the
    bound again. An owner in ``avoid`` comes last, in case it was only briefly unable.
    """
    out: list[Target] = []
    owner = view.active_owner(store, partition)
    avoided = owner is not None and owner.node_id in avoid
    max_lag = options.max_lag
    if options.allow_stale:
        if owner is not None and not avoided:
            out.append(Target(owner.node_id, owner.endpoint, True, owner.key_endpoint))
        standbys = sorted(view.standbys(store, partition), key=lambda n: n.lags.get(store, {}).get(partition, 1 << 62))
        for n in standbys:
            lag = n.lags.get(store, {}).get(partition)
            if n.node_id in avoid or (max_lag is not None and (lag is None or lag > max_lag)):
                continue
            out.append(Target(n.node_id, n.endpoint, False, n.key_endpoint))
        if owner is not None and avoided:
            out.append(Target(owner.node_id, owner.endpoint, True, owner.key_endpoint))
        return out
    restoring = owner is not None and partition in owner.restoring.get(store, ())
    if at_least is None or (owner is not None and not avoided and not restoring):
        if owner is not None and not avoided:
            out.append(Target(owner.node_id, owner.endpoint, True, owner.key_endpoint))
        return out

    def position(n) -> int:
        return n.positions.get(store, {}).get(partition, -1)

    for n in sorted(view.standbys(store, partition), key=position, reverse=True):
        if n.node_id not in avoid and position(n) >= at_least:
            out.append(Target(n.node_id, n.endpoint, False, n.key_endpoint))
    if owner is not None:
        out.append(Target(owner.node_id, owner.endpoint, True, owner.key_endpoint))
    return out


def local_refusals(options: ReadOptions, partitions: Iterable[int], lag: Callable[[int], int | None]) -> dict[int, str]:
    """Why this node's own copy of each of a global store's ``partitions``, ``lag(p)`` records
    behind its changelog (None: not known yet), may not answer a read with ``options``: the
    partitions that may not, each with its reason. A copy is every node's, as a standby is:
    ``max_lag`` bounds it when stale reads are allowed. Otherwise the copy must be current,
    which the copy itself checks (as an active owner does), and a consistency token's offsets
    are checked by the copy too. ``lag`` is asked only then: a read of every partition would
    otherwise ask it of each for nothing."""
    if not (options.allow_stale and options.max_lag is not None):
        return {}
    refused: dict[int, str] = {}
    for p in partitions:
        behind = lag(p)
        if behind is None or behind > options.max_lag:
            said = "has not seen its changelog's end yet" if behind is None else f"is {behind} records behind"
            refused[p] = f"this node's copy {said}, more than max_lag {options.max_lag}"
    return refused
