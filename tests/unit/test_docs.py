"""The docs site builds with warnings as errors, offline; every code block in README and docs/ is
run by the tests, is an excerpt of a tested file, or says why not; the error reference lists
every code as the code maps it; the pages say what is, with no internal history (issue numbers,
commit hashes, run timestamps: those belong to tests/bench/results.md)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from federator.errors import CODES
from tests.docs_blocks import ROOT, all_blocks, pages

MKDOCS = Path(sys.executable).with_name("mkdocs")


@pytest.mark.skipif(not MKDOCS.exists(), reason="mkdocs is in setup.cfg's test extra: make test installs it")
def test_the_site_builds_strict_and_offline(tmp_path) -> None:
    done = subprocess.run([str(MKDOCS), "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env={"PATH": str(MKDOCS.parent), "HOME": str(tmp_path),
                                                                            "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    assert "--pg-port" in cli and "federator store create" in cli  # generated from the parsers
    architecture = (tmp_path / "site" / "explanation" / "architecture" / "index.html").read_text()
    assert "federator.sql.engine" in architecture  # the module map, generated from the docstrings
    pages = [p.read_text() for p in (tmp_path / "site").rglob("*.html")]
    assert not any("fonts.googleapis.com" in p for p in pages)  # nothing loaded from the network


def test_every_code_block_is_run_excerpted_or_says_why_not() -> None:
    unmarked = [b.where for b in all_blocks() if b.marker is None and b.lang != "text"]
    assert unmarked == [], "mark each block <!-- run -->, <!-- excerpt of: FILE --> or <!-- not run: why -->"
    assert all(b.argument for b in all_blocks() if b.marker == "not run"), "say why a block is not run"
    run = [b for b in all_blocks() if b.marker == "run"]
    assert len(run) >= 8 and {b.lang for b in run} == {"sh", "python", "sql"}


def test_excerpts_are_in_the_files_they_name() -> None:
    for block in (b for b in all_blocks() if b.marker == "excerpt of"):
        lines = iter((ROOT / block.argument).read_text().splitlines())
        for wanted in (line for line in block.code.splitlines() if line.strip()):
            assert any(line == wanted for line in lines), f"{block.where}: {wanted!r} is not in {block.argument} (in order)"


def test_the_error_reference_lists_every_code_as_it_maps() -> None:
    sys.path.insert(0, str(ROOT / "docs" / "hooks"))
    try:
        from error_reference import MARKER, on_page_markdown
    finally:
        sys.path.remove(str(ROOT / "docs" / "hooks"))
    source = (ROOT / "docs" / "reference" / "errors.md").read_text()
    assert MARKER in source
    page = on_page_markdown(source, None, None, None)
    rows = [tuple(m.group(1).split(" | ")) for m in re.finditer(r"^\| (`[A-Z_]+`.*) \|$", page, re.M)]
    assert rows == [(f"`{r.code}`", str(r.http), r.grpc, r.sqlstate, r.dbapi, r.meaning, r.action) for r in CODES.values()]


def _flags_of(parser, path: list[str]) -> tuple[set[str], dict]:
    import argparse

    flags = {s for a in parser._actions for s in a.option_strings}
    subs = {}
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            subs = dict(a.choices)
    return flags, subs


def test_commands_in_every_block_name_real_commands_and_flags() -> None:
    """Blocks that do not run (they need a Kafka cluster, a certificate, ...) still may not name
    a `federator` command or flag the CLI lacks, and their Python must compile."""
    import shlex

    from federator.cli import build_parser

    checked = 0
    for block in all_blocks():
        if block.lang == "python":
            compile(block.code, block.where, "exec")
            continue
        if block.lang != "sh":
            continue
        for line in block.code.replace("\\\n", " ").splitlines():
            line = line.split("#", 1)[0].strip()
            if not line.startswith("federator "):
                continue
            words = shlex.split(line.replace("...", ""))[1:]
            parser, path = build_parser(), ["federator"]
            while words and not words[0].startswith("-"):
                flags, subs = _flags_of(parser, path)
                if words[0] not in subs:
                    break
                parser, path = subs[words[0]], path + [words.pop(0)]
            flags, _ = _flags_of(parser, path)
            unknown = [w.split("=")[0] for w in words if w.startswith("--") and w.split("=")[0] not in flags]
            assert not unknown, f"{block.where}: {' '.join(path)} has no {unknown}"
            checked += 1
    assert checked >= 5


# What a page for users must not carry: the project's internal history. Each pattern is narrow
# enough to leave numbers, ports, limits and SQL literals alone.
_HISTORY = {
    "an issue number": re.compile(r"\bissues? #?\d+\b|(?<![\w&/])#\d+\b", re.I),
    # 7 to 40 hex digits with a letter and a digit among them, standing alone (not 0x..., not a word)
    "a commit hash": re.compile(r"(?<![\w.-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}(?![\w-])"),
    "a run's date": re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b"),
    "a run's time": re.compile(r"\bruns? (?:of|at|from) \d{1,2}:\d\d\b|\b\d{1,2}:\d\d(?:–\d{1,2}:\d\d)? (?:UTC|on 20)"),
    "this machine": re.compile(r"\bthis (?:\d-core )?machine\b|\bscratch runs?\b", re.I),
}


def _prose(text: str) -> list[tuple[int, str]]:
    """The lines of a page outside fenced code blocks, with inline code taken out: a SQL literal
    such as TIMESTAMP '2024-01-01 00:00:00' is an example, not a run's date."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            out.append((number, re.sub(r"`[^`]*`", "", line)))
    return out


def history_in(text: str) -> list[str]:
    """What of the project's history a page's prose names: "line N: what: the words"."""
    return [f"line {n}: {what}: {m.group(0)!r}" for n, line in _prose(text)
            for what, pattern in _HISTORY.items() for m in pattern.finditer(line)]


def test_the_pages_carry_no_issue_numbers_commits_or_run_timestamps() -> None:
    found = {str(p.relative_to(ROOT)): history_in(p.read_text()) for p in pages()}
    found = {page: hits for page, hits in found.items() if hits}
    assert found == {}, ("say what is; dated runs and what changed belong in tests/bench/results.md: "
                         f"{found}")


def test_the_history_check_tells_history_from_numbers() -> None:
    for history in ("as issue 17 asked", "fixed in #42", "(commit 9cda11c)", "at 3185102 and 0565b92",
                    "the run of 2026-11-27", "runs of 14:36", "09:18–09:26 on 2026-11-27",
                    "on this 2-core machine", "scratch runs"):
        assert history_in(history), history
    for fine in ("port 5432, `LIMIT 1048575`, 9223372036854775808", "murmur2 & 0x7fffffff",
                 "`TIMESTAMP '2024-01-01 00:00:00'`", "Python 3.11, SQLAlchemy 1.4 and 2.x", "p99 3.65 ms at 12,546 req/s",
                 "a Spark session, session windows", "## Heading", "the colour #1f77b4 of a chart", "deadbeef cafe",
                 "a 40-byte key, 1,000,000 rows", "[link](page.md#section-2)"):
        assert history_in(fine) == [], fine
