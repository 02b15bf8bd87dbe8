"""Merging per-partition Arrow results at the receiving node."""
