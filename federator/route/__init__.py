"""Routing: which node answers which partition."""
