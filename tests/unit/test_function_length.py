"""No function in ``federator/`` or ``spark/`` (the service and the Spark side) is longer than
one can hold in one's head: 80 lines, its docstring, comments and blank lines included (a
nested function counts on its own, and in the function around it)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = [ROOT / "federator", ROOT / "spark"]
MOST_LINES = 80


def long_functions(package: Path, most: int) -> list[str]:
    """``path:line name (N lines)`` of every function under ``package`` longer than ``most`` lines."""
    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > most:
                    found.append(f"{path.relative_to(package.parent)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_is_over_80_lines() -> None:
    found = [f for package in PACKAGES for f in long_functions(package, MOST_LINES)]
    assert not found, "split these into named steps:\n" + "\n".join(found)


def test_the_walk_finds_a_long_function(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MOST_LINES))
    (tmp_path / "m.py").write_text(f"def short():\n    return 1\n\n\ndef long():\n{body}\n")
    assert long_functions(tmp_path, MOST_LINES) == [f"{tmp_path.name}/m.py:5 long ({MOST_LINES + 1} lines)"]
