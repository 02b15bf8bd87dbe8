"""`federator sql`: run one SQL statement on a node over HTTP and print the answer.

``--param`` values are typed by their text: ``42`` and ``-7`` are sent as JSON integers,
``1.5`` and ``2e3`` as JSON numbers, anything else (``alice``, ``true``, ``null``, ``0x1f``)
as a JSON string. The default ``table`` output asks for JSON and prints an aligned table;
``json``, ``csv`` and ``arrow`` write the server's body to stdout unchanged, as it streams.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import unicodedata
from typing import Any, BinaryIO, Sequence, TextIO

from federator.http.failure_marks import failure_at_end

DEFAULT_URL = "http://127.0.0.1:8080"
NUMERIC_TYPES = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT",
                 "FLOAT", "DOUBLE", "DECIMAL")
_INT = re.compile(r"[+-]?\d+")
_FLOAT = re.compile(r"[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?")
# Control characters would break the table's lines; show them escaped instead.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_READ_TIMEOUT_S = 60.0  # longer than any server-side timeout_ms a user is likely to wait for
_TAIL = 64 * 1024  # how much of a streamed answer's end is kept to look for the error marker


def add_sql_parser(sub: Any) -> None:
    """Add the `sql` subcommand to the `federator` command's subparsers."""
    p = sub.add_parser("sql", help="run a SQL query on a node over HTTP and print the result")
    p.add_argument("query", metavar="SQL", help='the statement, e.g. "SELECT * FROM scores WHERE key = ?"')
    p.add_argument("--url", help=f"a node's address (default: $FEDERATOR_URL or {DEFAULT_URL})")
    p.add_argument("--format", choices=("table", "json", "csv", "arrow"), default="table",
                   help="table (default, aligned text) or the raw json, csv or arrow (IPC stream) body")
    p.add_argument("--param", action="append", default=[], metavar="VALUE",
                   help="a value for the next ? placeholder (repeat); numbers are sent as numbers, the rest as strings")
    p.add_argument("--token", metavar="T", help="consistency token from an earlier answer: read at least that state")
    p.add_argument("--allow-stale", action="store_true", help="accept answers from standby replicas that may lag")
    p.add_argument("--tls-ca", metavar="PEM", help="for an https:// node: the CA certificates to check its certificate "
                   "against (default: $FEDERATOR_TLS_CA, else the system's)")
    p.add_argument("--auth-token", metavar="T",
                   help="bearer token of a user of the node's --users-file (default: $FEDERATOR_AUTH_TOKEN)")


def parse_param(text: str) -> int | float | str:
    """A --param value as the JSON value to send (see the module doc)."""
    if _INT.fullmatch(text):
        return int(text)
    if _FLOAT.fullmatch(text):
        return float(text)
    return text


def _endpoint(url: str) -> str:
    url = url.rstrip("/")
    return url if url.endswith("/v1/sql") else url + "/v1/sql"


def _describe_error(body: Any) -> str:
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict):
        return f"unexpected answer: {str(body)[:500]}"
    text = f"{err.get('code', 'ERROR')}: {err.get('message', '')}"
    if err.get("line") is not None:
        text += f" (line {err['line']}, column {err.get('col')})"
    return text


def _cell(v: Any) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (dict, list)):
        v = json.dumps(v, ensure_ascii=False, separators=(",", ":"))
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], str(v))


def _width(s: str) -> int:
    # East Asian wide characters take two terminal cells, combining marks none.
    return sum(0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in s)


def _pad(s: str, width: int, right: bool) -> str:
    fill = " " * (width - _width(s))
    return fill + s if right else s + fill


def format_table(columns: list[dict], rows: list[list], stats: dict | None = None) -> str:
    """An aligned text table: header, a rule, rows (numbers right-aligned), and a footer."""
    names = [str(c.get("name", "")) for c in columns]
    right = [str(c.get("type", "")).split("(")[0] in NUMERIC_TYPES for c in columns]
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([_width(n)] + [_width(r[i]) for r in cells]) for i, n in enumerate(names)]
    lines = []
    if names:
        lines.append("  ".join(_pad(n, w, r) for n, w, r in zip(names, widths, right)).rstrip())
        lines.append("  ".join("-" * w for w in widths))
        lines.extend("  ".join(_pad(c, w, r) for c, w, r in zip(row, widths, right)).rstrip() for row in cells)
    n = len(rows)
    footer = f"{n} row" + ("" if n == 1 else "s")
    elapsed = (stats or {}).get("elapsed_ms")
    if isinstance(elapsed, (int, float)):
        footer += f", {elapsed:.0f} ms"
    lines.append(f"({footer})")
    return "\n".join(lines)


def run_sql(args: argparse.Namespace, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    """Run the `sql` subcommand; returns the exit status (0, or 2 on any error)."""
    import urllib3  # here, not at the top: `federator --help` should not pay for it

    out = stdout or sys.stdout
    err = stderr or sys.stderr
    url = args.url or os.environ.get("FEDERATOR_URL") or DEFAULT_URL
    fmt = args.format
    if fmt == "arrow" and out.isatty():
        print("error: --format arrow writes binary; redirect it to a file or a pipe", file=err)
        return 2
    body = {"sql": args.query, "parameters": [parse_param(p) for p in args.param],
            "consistency_token": args.token, "allow_stale": bool(args.allow_stale),
            "format": "json" if fmt == "table" else fmt}
    ca = getattr(args, "tls_ca", None) or os.environ.get("FEDERATOR_TLS_CA")
    http = urllib3.PoolManager(retries=False, timeout=urllib3.Timeout(connect=5.0, read=_READ_TIMEOUT_S),
                               **({"ca_certs": ca, "cert_reqs": "CERT_REQUIRED"} if ca else {}))
    endpoint = _endpoint(url)
    try:
        headers = {"Content-Type": "application/json"}
        auth = getattr(args, "auth_token", None) or os.environ.get("FEDERATOR_AUTH_TOKEN")
        if auth:
            headers["Authorization"] = f"Bearer {auth}"
        resp = http.request("POST", endpoint, body=json.dumps(body).encode(), preload_content=False, headers=headers)
    except (urllib3.exceptions.NewConnectionError, urllib3.exceptions.ConnectTimeoutError,
            urllib3.exceptions.NameResolutionError) as e:
        print(f"error: cannot connect to a Federator node at {url} ({_reason(e)}). Is one running? "
              "Start one with `federator node` or `federator demo`, or point --url or $FEDERATOR_URL at one.", file=err)
        return 2
    except urllib3.exceptions.HTTPError as e:
        print(f"error: the request to {endpoint} failed: {_reason(e)}", file=err)
        return 2
    try:
        if resp.status >= 400 or fmt == "table":
            data = resp.read()
            try:
                doc = json.loads(data)
            except ValueError:
                print(f"error: HTTP {resp.status} from {endpoint}: {data[:500].decode('utf-8', 'replace')}", file=err)
                return 2
            if resp.status >= 400 or "error" in doc:  # an error met mid-stream arrives in the body
                print(f"error: {_describe_error(doc)}", file=err)
                return 2
            print(format_table(doc.get("columns", []), doc.get("rows", []), doc.get("stats")), file=out)
            return 0
        sink: BinaryIO = getattr(out, "buffer", out)  # type: ignore[assignment]
        tail = b""
        for chunk in resp.stream(64 * 1024):
            sink.write(chunk)
            tail = (tail + chunk)[-_TAIL:]
        sink.flush()
        failure = failure_at_end(fmt, tail)
        if failure is not None:  # the server failed mid-stream and marked the end (formats' module doc)
            print(f"error: the answer from {endpoint} is incomplete: {failure}", file=err)
            return 2
        return 0
    except urllib3.exceptions.HTTPError as e:  # the server gave up mid-body (see formats' module doc)
        print(f"error: the answer from {endpoint} was cut off: {_reason(e)}", file=err)
        return 2
    finally:
        resp.release_conn()


def _reason(e: BaseException) -> str:
    # urllib3 wraps the OS error; its own text repeats the pool's repr, the innermost is clearer.
    inner = e
    while inner.__context__ is not None and isinstance(inner.__context__, OSError):
        inner = inner.__context__
    return str(inner) or type(inner).__name__


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="federator")
    add_sql_parser(parser.add_subparsers(dest="command", required=True))
    return run_sql(parser.parse_args(argv))
