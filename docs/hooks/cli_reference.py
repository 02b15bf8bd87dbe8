"""MkDocs hook: the command-line reference, generated from federator.cli's argument parsers.

A page that holds the marker ``<!-- cli-reference -->`` gets, in its place, each command's
``--help`` as the installed ``federator`` prints it, so a renamed or new flag changes the docs
with the code.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Iterator

MARKER = "<!-- cli-reference -->"


def _commands(parser: argparse.ArgumentParser, path: list[str]) -> Iterator[tuple[list[str], argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:  # argparse keeps its subcommands here and nowhere public
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, path + [name])


def reference() -> str:
    from federator.cli import build_parser

    os.environ["COLUMNS"] = "100"  # argparse wraps help to the terminal: the same page on every machine
    out = []
    for path, parser in _commands(build_parser(), ["federator"]):
        if len(path) == 1:
            continue
        out.append(f"## `{' '.join(path)}`\n\n```text\n{parser.format_help().rstrip()}\n```\n")
    return "\n".join(out)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return markdown.replace(MARKER, reference()) if MARKER in markdown else markdown
