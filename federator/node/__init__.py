"""The node process: changelogs materialized into shards, the consumer group, the key port and the internal query call."""
