"""Self-signed certificates for the TLS tests, made with Debian's openssl command."""

from __future__ import annotations

import subprocess
from pathlib import Path


def make_certificate(root: Path, name: str = "node") -> tuple[Path, Path]:
    cert, key = root / f"{name}.pem", root / f"{name}.key"
    done = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                           "-subj", "/CN=federator-test", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
                           "-keyout", str(key), "-out", str(cert)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return cert, key
