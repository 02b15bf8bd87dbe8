"""MkDocs hook: the error reference's table, made from the one table of codes
(federator.errors.CODES), so the page lists every code a node can send, as it maps it."""

from __future__ import annotations

from typing import Any

MARKER = "<!-- error-codes -->"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if MARKER not in markdown:
        return markdown
    from federator.errors import markdown_table

    return markdown.replace(MARKER, markdown_table())
