"""MkDocs hook: the command-line reference, generated from federator.cli's argument parsers
and the node's settings (federator.settings).

A page that holds the marker ``<!-- cli-reference -->`` gets, in its place, each command's
``--help`` as the installed ``federator`` prints it, and one that holds ``<!-- node-settings -->``
the table of the node's settings (key, flag, variable, default, what it costs), and one that
holds ``<!-- node-caches -->`` the table of its caches, so a renamed or new flag changes the
docs with the code.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Iterator

MARKER = "<!-- cli-reference -->"
SETTINGS_MARKER = "<!-- node-settings -->"
CACHES_MARKER = "<!-- node-caches -->"


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


def _cell(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "&#124;")


def settings_table() -> str:
    """The node's settings as a Markdown table, group by group, in the order of the help."""
    from federator.settings import GROUPS, SETTINGS, default_text

    out = []
    for group, title in GROUPS.items():
        out += [f"**{title[0].upper()}{title[1:]}**", "",
                "| Key in the file | Flag | Variable | Default | What it is; what it costs |", "|---|---|---|---|---|"]
        for s in (s for s in SETTINGS if s.meta.group == group):
            env = f"`{s.meta.env}`" if s.meta.env else ""
            default = "required" if s.meta.required else default_text(s)
            what = s.meta.help + (" (secret: --print-config masks it)" if s.meta.secret else "")
            what += f". Cost: {s.meta.sizing}." if s.meta.sizing else ""
            out.append(f"| `{s.name}` | `{s.flag}` | {env} | {_cell(default)} | {_cell(what)} |")
        out.append("")
    return "\n".join(out)


def caches_table() -> str:
    """The node's caches as a Markdown table: what each keeps, what bounds it."""
    from federator.settings import CACHES

    rows = [f"| {c.name} | {_cell(c.keeps)} | {_cell(c.bound)} |" for c in CACHES]
    return "\n".join(["| Cache | What it keeps | What bounds it |", "|---|---|---|", *rows, ""])


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if CACHES_MARKER in markdown:
        markdown = markdown.replace(CACHES_MARKER, caches_table())
    if SETTINGS_MARKER in markdown:
        markdown = markdown.replace(SETTINGS_MARKER, settings_table())
    return markdown.replace(MARKER, reference()) if MARKER in markdown else markdown
