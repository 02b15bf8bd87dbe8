"""Apache Superset in its own environment, beside Federator's client, for the Superset test and
``make superset``.

Two layers, so that a clean clone reuses the slow part:
- Superset and its dependencies (superset_requirements.txt, exact pins), and beside it its
  metadata database initialised (``db upgrade``, an admin, ``init``; keyed by superset_config.py
  too): once per machine under ~/.cache/federator. Minutes the first time.
- ``.venv-superset`` in the checkout: a venv that sees that layer's packages (a .pth file) and has
  Federator's client installed from this repository, again whenever the client's files change.
  Seconds.

``python -m tests.integration.superset_env`` makes both (``make test`` and ``make superset`` do).
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import sqlite3
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import urllib3

from federator.broker import die_with_parent
from tests import maven_cache
from tests.light_install import new_venv

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
PINS = HERE / "superset_requirements.txt"
CONFIG = HERE / "superset_config.py"
CLIENT_VENV = ROOT / ".venv-superset"  # ignored by git
ADMIN = ("admin", "admin")  # the login of the local instance: user, password
METADATA = "metadata.db"  # the initialised metadata database in the cached layer, copied per run
# the files whose change reinstalls the client into .venv-superset
CLIENT_INPUTS = ("setup.cfg", "setup.py", "pyproject.toml")


def step(msg: str) -> None:
    print(f"==> {msg}", flush=True)


def base_layer() -> Path:
    """The cached layer: Superset's venv, made when missing."""
    return maven_cache.build_once(maven_cache.cache_dir("superset", [PINS]), _install_superset)


def metadata_template() -> Path:
    """Superset's initialised metadata database (cached beside the layer; copied for each run)."""
    base = base_layer()
    made = maven_cache.build_once(maven_cache.cache_dir("superset-metadata", [PINS, CONFIG, Path(__file__)]),
                                  lambda out: _init_metadata(base / "bin" / "python", out / METADATA))
    return made / METADATA


def superset_python() -> Path:
    """The Python of .venv-superset: Superset 6.1 and Federator's client from this checkout."""
    base = base_layer()
    python = CLIENT_VENV / "bin" / "python"
    marker = CLIENT_VENV / ".installed"
    want = f"{base}\n{_client_digest()}"
    if marker.exists() and marker.read_text() == want:
        return python
    step(f"making {CLIENT_VENV.name} over Superset's environment in {base}, with Federator's client")
    new_venv(CLIENT_VENV, ())
    site = _site_packages(python)
    # addsitedir, not a bare path line: the layer's own .pth files are read too
    (site / "_superset_base.pth").write_text(f"import site; site.addsitedir({str(_site_packages(base / 'bin' / 'python'))!r})\n")
    install_client(python)
    marker.write_text(want)
    return python


def install_client(python: Path) -> None:
    """Federator's client into the environment of ``python``, from this repository, as a user
    installs it beside Superset: the client alone with the SQLAlchemy extra, its dependencies
    resolved against Superset's pins; ``pip check`` then finds no conflict."""
    _pip(python, "install", f"{ROOT}[sqlalchemy]")
    _pip(python, "check")


def _client_digest() -> str:
    files = sorted(p for p in (ROOT / "federator").rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    return maven_cache.files_digest([*files, *(ROOT / name for name in CLIENT_INPUTS)], ROOT)


def _install_superset(out: Path) -> None:
    step(f"installing Apache Superset 6.1.0 into {out.parent} (a few minutes, once per machine)")
    new_venv(out, ("-r", str(PINS)))


def _init_metadata(python: Path, db: Path) -> None:
    step("initialising Superset's metadata (SQLite): db upgrade, an admin, init (about a minute)")
    env = superset_env(db)
    for args in (["db", "upgrade"],
                 ["fab", "create-admin", "--username", ADMIN[0], "--password", ADMIN[1],
                  "--firstname", "Federator", "--lastname", "Admin", "--email", "admin@example.com"],
                 ["init"]):
        cli(python, args, env)
    _a_table_in_each_database(db)


def _a_table_in_each_database(db: Path) -> None:
    """Superset's migrations leave its SQLite metadata with UNIQUE (table_name) on datasets (on
    its other metadata databases the key is database, schema and name), so a store could be a
    dataset of only one of the two databases. The table is made again without it, as SQLite
    changes a table (a copy, before any dataset exists)."""
    con = sqlite3.connect(db)
    try:
        ddl = con.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'tables'").fetchone()[0]
        with con:
            con.execute("PRAGMA foreign_keys = OFF")
            con.execute(ddl.replace('"tables"', "tables_new", 1).replace(", \n\tUNIQUE (table_name)", ""))
            con.execute("INSERT INTO tables_new SELECT * FROM tables")
            con.execute("DROP TABLE tables")
            con.execute("ALTER TABLE tables_new RENAME TO tables")
    finally:
        con.close()


def _pip(python: Path, *args: str) -> None:
    subprocess.run([str(python), "-m", "pip", "--disable-pip-version-check", "--quiet", *args,
                    *(("--progress-bar", "off") if args[0] == "install" else ())], check=True, timeout=1800)


def _site_packages(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def superset_env(metadata: Path) -> dict[str, str]:
    """The environment Superset runs in: this config, that metadata database, a fresh key."""
    return {**os.environ, "SUPERSET_CONFIG_PATH": str(CONFIG), "FEDERATOR_SUPERSET_DB": str(metadata),
            "FEDERATOR_SUPERSET_SECRET_KEY": secrets.token_hex(32)}


def cli(python: Path, args: list[str], env: dict[str, str]) -> None:
    """``superset ARGS``; its output is shown only when it fails."""
    done = subprocess.run([str(python), "-c", "from superset.cli.main import superset; superset()", *args],
                          env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"superset {' '.join(args[:2])} failed (exit {done.returncode}):\n"
                           f"{(done.stdout + done.stderr)[-4000:]}")


@dataclass
class Superset:
    url: str
    log: Path
    proc: subprocess.Popen


@contextmanager
def running(run_dir: Path, port: int, preexec_fn: Callable[[], None] | None = die_with_parent(signal.SIGTERM)
            ) -> Iterator[Superset]:
    """Superset's web server (gunicorn, one worker with threads) on 127.0.0.1:``port``, over a copy
    of the initialised metadata in ``run_dir``; stopped on leaving (and when this process dies:
    ``preexec_fn``)."""
    python = superset_python()
    metadata = run_dir / "superset.db"
    shutil.copyfile(metadata_template(), metadata)
    log = run_dir / "superset.log"
    cmd = [str(python), "-m", "gunicorn", "--workers", "1", "--worker-class", "gthread", "--threads", "8",
           "--timeout", "120", "--bind", f"127.0.0.1:{port}", "superset.app:create_app()"]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env=superset_env(metadata), cwd=run_dir, stdout=out, stderr=subprocess.STDOUT,
                                preexec_fn=preexec_fn)
    server = Superset(f"http://127.0.0.1:{port}", log, proc)
    try:
        _wait_healthy(server)
        yield server
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_healthy(server: Superset, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"Superset exited with code {server.proc.returncode}:\n{server.log.read_text()[-4000:]}")
        try:
            if urllib3.request("GET", f"{server.url}/health", timeout=2, retries=False).status == 200:
                return
        except urllib3.exceptions.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"Superset did not answer /health within {timeout:.0f}s; its log: {server.log}")


if __name__ == "__main__":
    metadata_template()
    step(f"Superset's environment: {superset_python().parent.parent}")
