"""Federator: SQL over the live state of a data pipeline's partitioned key-value stores."""

__version__ = "0.1.0"
