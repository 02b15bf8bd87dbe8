"""Clients of a Federator node's public HTTP API (the `federator sql` command)."""
