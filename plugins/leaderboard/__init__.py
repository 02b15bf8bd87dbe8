"""Leaderboard plugin: a ``leaderboard`` store type (player → score with a score index),
TopKQuery, RankQuery, PlacesQuery, ScoresQuery, AroundQuery, PlayerRanksQuery and RanksAroundQuery,
and the SQL rules that use them. See docs/plugins.md."""

from __future__ import annotations

from federator.plugin import hookimpl


@hookimpl
def register_store_types():
    from federator_plugins.leaderboard.store import LeaderboardStoreType

    return [LeaderboardStoreType()]


@hookimpl
def register_query_types():
    from federator_plugins.leaderboard.queries import (AroundQuery, PlacesQuery, PlayerRanksQuery, RankQuery,
                                                       RanksAroundQuery, ScoresQuery, TopKQuery)

    return [TopKQuery, RankQuery, PlacesQuery, ScoresQuery, AroundQuery, PlayerRanksQuery, RanksAroundQuery]


@hookimpl
def register_sql_rules():
    from federator_plugins.leaderboard.rules import RankRule, TopKRule

    return [TopKRule(), RankRule()]
