"""The code blocks of README.md and docs/, with what the line before each says to do with it.

A block is preceded by one of:
- ``<!-- run -->``: the tests run it (sh: each command; python: the code; sql: through psql)
  against the demo, and a ``<!-- output -->`` ``text`` block right after it is its exact output;
- ``<!-- excerpt of: PATH -->``: its lines appear, in order, in that file (which is tested);
- ``<!-- not run: why -->``: said why, and counted.
``text`` blocks without a marker (pictures, URLs) are not code.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_MARKER = re.compile(r"<!--\s*(run|output|excerpt of|not run)\s*(?::\s*(.*?))?\s*-->")


@dataclass
class Block:
    path: Path
    line: int
    lang: str
    code: str
    marker: str | None
    argument: str | None
    output: str | None = None  # the <!-- output --> block after a run block

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = re.match(r"^```(\S*)", lines[i])
        if not m:
            i += 1
            continue
        start, lang = i, m.group(1)
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        prev = next((lines[k] for k in range(start - 1, -1, -1) if lines[k].strip()), "")
        marker = _MARKER.search(prev)
        block = Block(path, start + 1, lang, "\n".join(lines[start + 1:j]),
                      marker.group(1) if marker else None, marker.group(2) if marker else None)
        if block.marker == "output" and out and out[-1].marker == "run":
            out[-1].output = block.code
        else:
            out.append(block)
        i = j + 1
    return out


def all_blocks() -> list[Block]:
    return [b for p in pages() for b in blocks(p)]
