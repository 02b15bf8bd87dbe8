"""MkDocs hook: the architecture page's module map, made from the modules' own docstrings (the
first sentence of each module of federator/), so the map says what the code says it is."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

MARKER = "<!-- module-map -->"
PACKAGE = Path(__file__).resolve().parents[2] / "federator"
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`(])")


def summary(docstring: str) -> str:
    """A docstring's first sentence, on one line."""
    paragraph = " ".join(docstring.strip().split("\n\n", 1)[0].split())
    return _SENTENCE_END.split(paragraph, 1)[0]


def modules(package: Path = PACKAGE) -> dict[str, str | None]:
    """Every module of the package, dotted, to its docstring's first sentence (None: it has no docstring)."""
    out: dict[str, str | None] = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        doc = ast.get_docstring(ast.parse(path.read_text()))
        out[name] = summary(doc) if doc else None
    return out


def markdown_table(package: Path = PACKAGE) -> str:
    rows = ["| module | what it is |", "|---|---|"]
    rows += [f"| `{name}` | {(text or '').replace('|', '&#124;')} |" for name, text in sorted(modules(package).items())]
    return "\n".join(rows)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, markdown_table())
