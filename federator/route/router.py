"""Partition → node, from the membership view; standbys when stale reads are allowed."""

from __future__ import annotations

from dataclasses import dataclass

from federator.node.membership import ClusterView


@dataclass(frozen=True)
class Target:
    node_id: str
    endpoint: str
    active: bool


def targets_for(view: ClusterView, store: str, partition: int, allow_stale: bool, max_lag: int | None,
                avoid: frozenset[str] = frozenset()) -> list[Target]:
    """Where to ask, best first: the active owner, then (with allow_stale) standbys within max_lag."""
    out: list[Target] = []
    owner = view.active_owner(store, partition)
    if owner is not None and owner.node_id not in avoid:
        out.append(Target(owner.node_id, owner.endpoint, True))
    if allow_stale:
        standbys = sorted(view.standbys(store, partition), key=lambda n: n.lags.get(store, {}).get(partition, 1 << 62))
        for n in standbys:
            lag = n.lags.get(store, {}).get(partition)
            if n.node_id in avoid or (max_lag is not None and (lag is None or lag > max_lag)):
                continue
            out.append(Target(n.node_id, n.endpoint, False))
        if owner is not None and owner.node_id in avoid:
            out.append(Target(owner.node_id, owner.endpoint, True))
    return out
