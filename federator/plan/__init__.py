"""Planning: key predicates turned into IQv2 queries and the partitions that hold their keys."""
