"""Who may use each entry of a node: the table the access test checks cell by cell, and the
security page of the docs is made from (docs/hooks/security_reference.py).

A column is a node's set-up; a cell is what a caller gets without credentials, with wrong ones
and with right ones, in that order. Credentials are a bearer token (or the Postgres password)
of a user in --users-file for the public entries, and the cluster secret for the node-to-node
ones. ``rows`` means the store's data came back; ``ok`` an answer that holds no data;
``401``/``403`` those HTTP statuses; ``refused`` a connection refused at login.
"""

from __future__ import annotations

from dataclasses import dataclass

# column -> (users, cluster secret, TLS); every node listens on loopback (127.0.0.1)
SETUPS: dict[str, tuple[bool, bool, bool]] = {
    "open": (False, False, False),
    "secret": (False, True, False),
    "users": (True, True, False),
    "secret+TLS": (False, True, True),
    "users+TLS": (True, True, True),
}
SETUP_TEXT = {
    "open": "no users, no cluster secret (loopback only)",
    "secret": "a cluster secret, no users",
    "users": "users and a cluster secret",
    "secret+TLS": "a cluster secret and TLS, no users",
    "users+TLS": "users, a cluster secret and TLS",
}

TABLE = """
entry                                        | gives                   | open           | secret               | users                | secret+TLS           | users+TLS
HTTP POST /v1/sql                            | rows                    | rows rows rows | rows rows rows       | 401 401 rows         | rows rows rows       | 401 401 rows
HTTP GET /v1/stores/{name}/keys/{key}        | a row                   | rows rows rows | rows rows rows       | 401 401 rows         | rows rows rows       | 401 401 rows
HTTP GET /v1/stores                          | store definitions       | ok ok ok       | ok ok ok             | 401 401 ok           | ok ok ok             | 401 401 ok
HTTP GET /v1/stores/{name}                   | a store's definition    | ok ok ok       | ok ok ok             | 401 401 ok           | ok ok ok             | 401 401 ok
HTTP GET /v1/metadata                        | the cluster map         | ok ok ok       | ok ok ok             | 401 401 ok           | ok ok ok             | 401 401 ok
HTTP GET /v1/metadata/stores/{store}/keys/{key} | a key's owner        | ok ok ok       | ok ok ok             | 401 401 ok           | ok ok ok             | 401 401 ok
HTTP GET /v1/plugins                         | the plugins             | ok ok ok       | ok ok ok             | 401 401 ok           | ok ok ok             | 401 401 ok
HTTP POST /internal/v1/query                 | rows (node to node)     | rows rows rows | 403 403 rows         | 403 403 rows         | 403 403 rows         | 403 403 rows
key port: a key's value                      | a row (node to node)    | rows rows rows | refused refused rows | refused refused rows | refused refused rows | refused refused rows
key port: a partition query                  | rows (node to node)     | rows rows rows | refused refused rows | refused refused rows | refused refused rows | refused refused rows
key port: the positions watch                | offsets (node to node)  | ok ok ok       | refused refused ok   | refused refused ok   | refused refused ok   | refused refused ok
Flight SQL: a statement                      | rows                    | rows rows rows | rows rows rows       | refused refused rows | rows rows rows       | refused refused rows
Postgres: a query                            | rows                    | rows rows rows | rows rows rows       | refused refused rows | rows rows rows       | refused refused rows
HTTP GET /                                   | the console's page      | ok ok ok       | ok ok ok             | ok ok ok             | ok ok ok             | ok ok ok
HTTP GET /console/{name}                     | the console's script    | ok ok ok       | ok ok ok             | ok ok ok             | ok ok ok             | ok ok ok
HTTP GET /openapi.json                       | the API's description   | ok ok ok       | ok ok ok             | ok ok ok             | ok ok ok             | ok ok ok
HTTP GET /metrics                            | counters, no data       | ok ok ok       | ok ok ok             | ok ok ok             | ok ok ok             | ok ok ok
HTTP GET /healthz                            | up or not               | ok ok ok       | ok ok ok             | ok ok ok             | ok ok ok             | ok ok ok
HTTP GET /readyz                             | ready or not            | ok ok ok       | ok ok ok             | ok ok ok             | ok ok ok             | ok ok ok
"""

# Set-ups a node refuses to start with, and the words its error must hold.
REFUSED_STARTS: dict[str, tuple[list[str], str]] = {
    "users without a cluster secret": (["--users-file", "{users}"], "needs a cluster secret"),
    "a --listen beyond loopback without a cluster secret": (["--listen", "0.0.0.0:{port}", "--allow-anonymous"],
                                                            "needs a cluster secret"),
    "a cluster secret shorter than 16 characters": (["--cluster-secret-file", "{short}"], "fewer than 16"),
}


@dataclass(frozen=True)
class Cell:
    entry: str
    setup: str
    outcomes: tuple[str, str, str]  # without, with wrong, with right credentials


def entries() -> list[tuple[str, str]]:
    """(entry, what it gives), in the table's order."""
    return [(row[0], row[1]) for row in _rows()]


def cells() -> list[Cell]:
    out = []
    for row in _rows():
        for setup, text in zip(SETUPS, row[2:]):
            outcomes = tuple(text.split())
            assert len(outcomes) == 3, (row[0], setup, text)
            out.append(Cell(row[0], setup, outcomes))  # type: ignore[arg-type]
    return out


def _rows() -> list[list[str]]:
    lines = [line for line in TABLE.strip().splitlines()[1:] if line.strip()]
    return [[part.strip() for part in line.split("|")] for line in lines]


def markdown() -> str:
    """The table as the security page shows it."""
    head = "| entry | gives | " + " | ".join(SETUP_TEXT[s] for s in SETUPS) + " |"
    rule = "|---|---|" + "---|" * len(SETUPS)
    body = []
    for row in _rows():
        cells_ = [" / ".join(c.split()) for c in row[2:]]
        body.append(f"| `{row[0]}` | {row[1]} | " + " | ".join(cells_) + " |")
    refused = "\n".join(f"- {what}: the error says \"… {words} …\" and what to add" for what, (_, words)
                        in REFUSED_STARTS.items())
    return "\n".join([head, rule, *body]) + "\n\nA node refuses to start with:\n\n" + refused + "\n"
