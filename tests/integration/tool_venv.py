"""Client tools the tests drive as their users install them: each in a venv of its own beside the
repository (ignored by git), made with pinned versions when missing or pinned otherwise, and kept
between runs, so that a run pays for the install once per machine."""

from __future__ import annotations

from pathlib import Path

from tests.light_install import cached_venv

ROOT = Path(__file__).resolve().parents[2]
SQLA14_PINS = ("SQLAlchemy==1.4.54", "psycopg2-binary==2.9.13")
# pgcli and what it runs on (pgspecial answers its backslash commands; psycopg needs Debian's libpq)
PGCLI_PINS = ("pgcli==4.7.1", "pgspecial==2.2.1", "psycopg==3.3.9", "prompt_toolkit==3.0.53")


def tool_venv(name: str, pins: tuple[str, ...]) -> Path:
    """The bin folder of ``.venv-<name>``, with ``pins`` installed."""
    return cached_venv(ROOT / f".venv-{name}", pins).parent


def sqla14_python() -> Path:
    """The Python of a venv with SQLAlchemy 1.4 and psycopg2."""
    return tool_venv("sqla14", SQLA14_PINS) / "python"
