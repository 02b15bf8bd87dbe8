"""pgcli, as a person uses it: in a terminal (tmux), against a node's Postgres port on the shared
``bi_cluster``. It connects with its default settings, lists and describes the stores, completes
store and column names from what it read of the catalog, and shows a query's rows; what the
screen shows is compared with the stores and with DuckDB over the same rows.

pgcli (pinned) is installed into .venv-pgcli once per machine (tests/integration/tool_venv.py).
The module sorts between test_connect_names.py and test_connect_postgres.py, so they share one
cluster.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Callable

import pytest

from tests.integration.bi_cluster import BiCluster, bi_cluster  # noqa: F401 - bi_cluster is a fixture
from tests.integration.tool_venv import PGCLI_PINS, tool_venv

TMUX = shutil.which("tmux")
pytestmark = pytest.mark.skipif(TMUX is None, reason="Debian's tmux is missing: make test installs it")

# Postgres's names of the oracle's DuckDB column types, as \d shows them
PG_TYPE = {"VARCHAR": "character varying", "BIGINT": "bigint", "INTEGER": "integer", "DOUBLE": "double precision",
           "BOOLEAN": "boolean", "BLOB": "bytea", "TIMESTAMP WITH TIME ZONE": "timestamp with time zone"}
PSEUDO = [("rowtime", "timestamp with time zone")]  # every store's record timestamp, after its columns


class Terminal:
    """One program in a tmux session of its own (its own server socket): keys in, the screen out."""

    def __init__(self, socket: Path, command: list[str], env: dict[str, str]) -> None:
        self.tmux = [TMUX, "-S", str(socket)]
        # the window is tall, so that a query's rows and a completion menu fit on one screen
        subprocess.run([*self.tmux, "new-session", "-d", "-s", "t", "-x", "160", "-y", "80",
                        *(a for k, v in env.items() for a in ("-e", f"{k}={v}")), " ".join(command)],
                       check=True, timeout=30)

    def keys(self, *keys: str) -> None:
        subprocess.run([*self.tmux, "send-keys", "-t", "t", *keys], check=True, timeout=30)

    def type(self, text: str) -> None:
        subprocess.run([*self.tmux, "send-keys", "-t", "t", "-l", text], check=True, timeout=30)

    def screen(self) -> str:
        return subprocess.run([*self.tmux, "capture-pane", "-p", "-t", "t", "-S", "-300"], check=True,
                              capture_output=True, text=True, timeout=30).stdout

    def wait(self, until: Callable[[str], bool], what: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            screen = self.screen()
            if until(screen):
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"pgcli did not show {what} in {timeout:.0f} s; the screen:\n{screen}")
            time.sleep(0.2)

    def clear(self) -> None:
        """Empties the line (Ctrl-E Ctrl-U), which closes a completion menu too."""
        self.keys("C-e", "C-u")
        time.sleep(0.3)

    def stop(self) -> None:
        subprocess.run([*self.tmux, "kill-server"], timeout=30)


@pytest.fixture
def pgcli(bi_cluster, tmp_path):
    binary = tool_venv("pgcli", PGCLI_PINS) / "pgcli"
    node = bi_cluster.nodes[0]
    # a fresh config (pgcli writes its default one), no pager, the server's time zone as the local one
    env = {"XDG_CONFIG_HOME": str(tmp_path / "config"), "PAGER": "cat", "TZ": "UTC", "TERM": "xterm",
           "PATH": os.environ.get("PATH", "")}
    term = Terminal(tmp_path / "tmux.sock", [str(binary), "-h", "127.0.0.1", "-p", str(node.pg_port),
                                              "-U", "tester", "-d", "federator", "--no-password"], env)
    try:
        term.wait(lambda s: "tester@127.0.0.1:federator>" in s, "its prompt")
        yield term
    finally:
        term.stop()


def _since(screen: str, marker: str) -> str:
    """The screen from the last ``marker`` on ("" before it shows)."""
    at = screen.rfind(marker)
    return "" if at < 0 else screen[at:]


def _answered(marker: str) -> Callable[[str], bool]:
    """Whether pgcli printed the status line (SELECT n) of the command typed as ``marker``."""
    return lambda screen: re.search(r"SELECT \d+\s", _since(screen, marker)) is not None


def _table_rows(screen: str, after: str) -> list[list[str]]:
    """The cells of the rows pgcli printed after the last ``after``, as | a | b | lines."""
    lines = [ln for ln in _since(screen, after).splitlines() if ln.startswith("| ") and not ln.startswith("|--")]
    return [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in lines[1:]]  # the first is the header


def _menu(screen: str, line: str) -> list[tuple[str, str]]:
    """The completion menu under the input ``line``: (completion, its kind, where pgcli shows it) pairs."""
    below = _since(screen, line)[len(line):].splitlines()[1:]
    return [(m.group(1), m.group(2) or "") for ln in below if (m := re.match(r"^\s+(\S+)(?:\s+(\w+))?\s*$", ln))]


def _store_columns(c: BiCluster, store: str) -> list[tuple[str, str]]:
    described = c.db.execute(f"DESCRIBE {store}").fetchall()
    return [(name, PG_TYPE[kind]) for name, kind, *_ in described] + PSEUDO


def test_pgcli_lists_describes_completes_and_queries_the_stores(bi_cluster, pgcli) -> None:
    c, term = bi_cluster, pgcli
    stores = sorted(r[0] for r in c.db.execute("SELECT table_name FROM information_schema.tables").fetchall())

    term.type("\\dt")
    term.keys("Enter")
    screen = term.wait(_answered("\\dt"), "\\dt's tables")
    assert _table_rows(screen, "\\dt") == [["public", s, "table", "federator"] for s in stores]

    term.type("\\d players")
    term.keys("Enter")
    screen = term.wait(lambda s: "players_pkey" in s, "\\d players' key")
    described = [(r[0], r[1], r[2]) for r in _table_rows(screen, "\\d players")]
    assert described == [(n, t, "not null" if n == "player" else "") for n, t in _store_columns(c, "players")]
    assert '"players_pkey" PRIMARY KEY, btree (player)' in screen

    # a store's name completed: pgcli read the stores at start-up (in the background, so the line
    # is typed again until they are there); it completes in a thread of its own, so the menu
    # shows a moment after the Tab
    def completes(line: str, keys: tuple[str, ...], wanted: Callable[[list], bool], what: str) -> list:
        deadline = time.monotonic() + 30
        while True:
            term.clear()
            term.type(line)
            term.keys(*keys, "Tab")
            try:
                return _menu(term.wait(lambda s: wanted(_menu(s, line)), what, timeout=3), line)
            except AssertionError:
                if time.monotonic() > deadline:
                    raise

    for line, store in (("SELECT * FROM pl", "players"), ("SELECT * FROM public.pe", "per_minute")):
        menu = completes(line, (), lambda m: store in dict(m), f"the store {store}")
        assert menu[0][0] == store and "blobs" not in dict(menu)  # pgcli's matching is fuzzy: the best first

    # a query's rows, as DuckDB gives them over the same rows
    term.clear()
    query = "SELECT player, games, score FROM players WHERE team = 'red' ORDER BY player"
    term.type(query)
    time.sleep(0.5)  # the menu that typing opened has no completion chosen: Enter runs the line
    term.keys("Enter")
    screen = term.wait(_answered(query), "the query's rows")
    expected = c.db.execute(query).fetchall()
    assert _table_rows(screen, query) == [[str(v) if v is not None else "<null>" for v in r] for r in expected]
    assert f"SELECT {len(expected)}" in screen and len(expected) > 5


def test_pgcli_completes_a_stores_columns_from_the_catalog(bi_cluster) -> None:
    """pgcli's completer (its own code, in its venv) loads the node's catalog as pgcli does at
    start-up and offers the columns of the store a FROM clause names, after SELECT and in WHERE.
    In the terminal the column menu did not show reliably under tmux (the completions were
    computed, pgcli's log says, but not drawn), so columns are asked of the completer directly;
    stores are completed in the terminal above."""
    python = tool_venv("pgcli", PGCLI_PINS) / "python"
    port = str(bi_cluster.nodes[0].pg_port)
    want = sorted(n for n, _ in _store_columns(bi_cluster, "per_minute"))
    for text, cursor in (("SELECT  FROM per_minute", len("SELECT ")), ("SELECT * FROM per_minute WHERE ", None)):
        done = subprocess.run([str(python), str(Path(__file__).with_name("pgcli_complete.py")), port, text,
                               str(len(text) if cursor is None else cursor)], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        menu = json.loads(done.stdout)
        columns = [t for t, meta in menu if meta == "column"]
        assert sorted(columns) == want and [t for t, _ in menu[:len(want)]] == columns, menu[:10]
