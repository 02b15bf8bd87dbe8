"""The PySpark side of Federator: a sink that writes any DataFrame into a store
(:func:`federator_spark.sink.write_store`) and the jobs in :mod:`federator_spark.jobs`."""

from federator_spark.sink import SinkError, write_store

__all__ = ["SinkError", "write_store"]
