"""SQLAlchemy support: the ``federator://`` dialect (``dialect``), and a Superset engine spec
(``superset``). Registered through the ``sqlalchemy.dialects`` and ``superset.db_engine_specs``
entry points."""
