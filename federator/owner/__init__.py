"""What an owner runs over its partitions' rows before they leave the node: the SQL the
planner pushed down (a filter, a top-k, a partial aggregate) and co-partitioned joins, in a
sandboxed DuckDB or, for a join on the keys, as a lookup in Arrow."""
