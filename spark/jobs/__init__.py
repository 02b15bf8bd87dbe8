"""Spark jobs that fill Federator stores; each runs as ``python -m spark.jobs.NAME``."""
