"""Spark jobs that fill Federator stores; each runs as ``python -m federator_spark.jobs.NAME``."""
