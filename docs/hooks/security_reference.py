"""MkDocs hook: the security page's table of who may use each entry of a node, made from the
table the access test checks cell by cell (tests/integration/access_matrix.py), so the page
says what the test proves."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

MARKER = "<!-- access-matrix -->"
_ROOT = str(Path(__file__).resolve().parents[2])


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if MARKER not in markdown:
        return markdown
    if _ROOT not in sys.path:  # mkdocs runs from .venv/bin; the table lives in the repository's tests
        sys.path.insert(0, _ROOT)
    from tests.integration.access_matrix import markdown as table

    return markdown.replace(MARKER, table())
