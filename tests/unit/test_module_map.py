"""The architecture page's module map is made from the modules' docstrings: every module of
federator/ says in its docstring's first sentence what it is, and the map lists each module
with that sentence."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.docs_blocks import ROOT


@pytest.fixture(scope="module")
def module_map():
    sys.path.insert(0, str(ROOT / "docs" / "hooks"))
    try:
        import module_map
    finally:
        sys.path.remove(str(ROOT / "docs" / "hooks"))
    return module_map


def test_every_module_says_what_it_is(module_map) -> None:
    found = module_map.modules()
    assert len(found) == len(list((ROOT / "federator").rglob("*.py"))) > 100
    missing = sorted(name for name, text in found.items() if not text)
    assert missing == [], "give each module a docstring whose first sentence says what it does"
    unfinished = sorted(name for name, text in found.items() if not text.endswith((".", ")")))
    assert unfinished == [], "end each docstring's first sentence with a full stop"


def test_the_map_lists_each_module_with_its_first_sentence(module_map, tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""The package.\n\nMore about it."""\n')
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "thing.py").write_text('"""A thing | a pipe. It does more: federator.x says so.\n\nAnd more."""\nX = 1\n')
    assert module_map.modules(pkg) == {"pkg": "The package.", "pkg.sub": None, "pkg.sub.thing": "A thing | a pipe."}
    assert module_map.markdown_table(pkg).splitlines()[2:] == [
        "| `pkg` | The package. |", "| `pkg.sub` |  |", "| `pkg.sub.thing` | A thing &#124; a pipe. |"]
    assert module_map.summary("federator.store.layer describes the\n  stack. Then more.") == \
        "federator.store.layer describes the stack."


def test_the_architecture_page_carries_the_map(module_map) -> None:
    source = (ROOT / "docs" / "explanation" / "architecture.md").read_text()
    page = module_map.on_page_markdown(source, None, None, None)
    assert module_map.MARKER in source and module_map.MARKER not in page
    for name, text in module_map.modules().items():
        assert f"| `{name}` | {text.replace('|', '&#124;')} |" in page
    assert "docs/hooks/module_map.py" in (ROOT / "mkdocs.yml").read_text()
