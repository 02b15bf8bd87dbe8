"""Postgres wire protocol front door (`federator node --pg-port`): psql, JDBC and BI tools, with a pg_catalog over the stores."""
