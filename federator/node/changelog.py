"""Changelog messages as the records a shard applies."""

from __future__ import annotations

from typing import Iterable

from confluent_kafka import Message

from federator.store.record import ChangelogRecord


def to_records(messages: Iterable[Message]) -> list[ChangelogRecord]:
    return [ChangelogRecord(m.key() or b"", m.value(), m.offset(), m.timestamp()[1]) for m in messages]
