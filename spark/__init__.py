"""The PySpark side of Federator: a sink that writes any DataFrame into a store
(:func:`spark.sink.write_store`) and the jobs in :mod:`spark.jobs`."""

from spark.sink import SinkError, write_store

__all__ = ["SinkError", "write_store"]
