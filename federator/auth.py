"""Who may use a node's public entries: users and their bearer tokens, from a users file.

A line of the file is ``name:SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>``
(base64), the form Postgres keeps its passwords in (RFC 5802/7677): the file never holds a
token, only what checks one, and the same entry serves a bearer token over HTTP and Flight
SQL and a SCRAM-SHA-256 password exchange over the Postgres protocol. Lines starting with
``#`` and blank lines are skipped. ``federator users add NAME --users-file F`` makes a
token, prints it once and appends its entry.

Checking a token derives its key (PBKDF2, a few milliseconds by design), so a token that
checked out is remembered by its SHA-256 and later requests cost a dictionary lookup. A new
token is checked against every user, matching or not, so the time taken says nothing about
which user (if any) it belongs to.

Failed logins (a refused bearer token or Postgres password) are logged with the peer's
address and counted per address (``FailedLogins``): past a few failures a peer is shut out
for a while that doubles with each further failure, so tokens cannot be guessed at line rate.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import secrets
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from federator.errors import FederatorError, SqlError

SCHEME = "SCRAM-SHA-256"
ITERATIONS = 4096  # Postgres's default for SCRAM-SHA-256
USERS_FILE_ENV = "FEDERATOR_USERS_FILE"
_NAME = re.compile(r"[A-Za-z0-9_.@-]{1,64}")
_REMEMBERED = 10_000  # tokens remembered (checked and refused alike), least recently used dropped
log = logging.getLogger(__name__)


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode("ascii")


@dataclass(frozen=True)
class Verifier:
    """What checks one user's token: SCRAM-SHA-256's salted keys, never the token itself."""

    iterations: int
    salt: bytes
    stored_key: bytes
    server_key: bytes

    @classmethod
    def of(cls, token: str, iterations: int = ITERATIONS, salt: bytes | None = None) -> Verifier:
        salt = salt if salt is not None else secrets.token_bytes(16)
        salted = salted_password(token, salt, iterations)
        client_key = hmac.digest(salted, b"Client Key", "sha256")
        return cls(iterations, salt, hashlib.sha256(client_key).digest(), hmac.digest(salted, b"Server Key", "sha256"))

    @classmethod
    def parse(cls, text: str) -> Verifier:
        m = re.fullmatch(rf"{SCHEME}\$(\d+):([A-Za-z0-9+/=]+)\$([A-Za-z0-9+/=]+):([A-Za-z0-9+/=]+)", text)
        if m is None:
            raise ValueError(f"expected {SCHEME}$<iterations>:<salt>$<StoredKey>:<ServerKey>")
        iterations = int(m.group(1))
        if iterations < 1:
            raise ValueError("the iteration count must be at least 1")
        salt, stored, server = (base64.b64decode(m.group(i), validate=True) for i in (2, 3, 4))
        return cls(iterations, salt, stored, server)

    def text(self) -> str:
        return f"{SCHEME}${self.iterations}:{_b64(self.salt)}${_b64(self.stored_key)}:{_b64(self.server_key)}"

    def matches(self, token: str) -> bool:
        client_key = hmac.digest(salted_password(token, self.salt, self.iterations), b"Client Key", "sha256")
        return hmac.compare_digest(hashlib.sha256(client_key).digest(), self.stored_key)


def salted_password(token: str, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac("sha256", token.encode("utf-8"), salt, iterations)


class UsersFileError(FederatorError, ValueError):
    """The users file cannot be read; the message names the file, the line and what to do."""

    code = "INVALID_PARAMETER"


@dataclass(frozen=True)
class Login:
    """The outcome of one login: the user, or None; ``retry_after`` > 0 when the peer is shut
    out (too many failures) and its credentials were not even checked."""

    user: str | None
    retry_after: float = 0.0

    def error(self) -> SqlError | None:
        """The refusal as an error (TOO_MANY_FAILED_LOGINS while shut out), or None for a user."""
        if self.retry_after:
            return SqlError("TOO_MANY_FAILED_LOGINS", self.refusal(), retry_after=self.retry_after)
        return None if self.user is not None else SqlError("UNAUTHENTICATED", self.refusal())

    def refusal(self) -> str:
        """What to tell a refused caller."""
        if self.retry_after:
            return (f"too many failed logins from this address: try again in {self.retry_after:.0f} s "
                    "with a token `federator users add` printed")
        return "the token is not one of this node's users'; send a token `federator users add` printed"


class FailedLogins:
    """Failed logins per peer address, and the back-off that slows a guesser down.

    A peer's first ``free`` failures within ``window`` seconds cost it nothing (a person who
    mistyped); each failure after that shuts the peer out for 2, 4, 8, ... seconds, up to
    ``max_wait``. While shut out, its logins are refused unchecked. A success forgets the
    peer's failures. At most ``peers`` addresses are tracked, the least recent dropped."""

    def __init__(self, free: int = 10, window: float = 60.0, max_wait: float = 60.0, peers: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.free, self.window, self.max_wait, self.peers, self.clock = free, window, max_wait, peers, clock
        self._peers: OrderedDict[str, tuple[list[float], float]] = OrderedDict()  # peer -> (failure times, shut until)
        self._lock = threading.Lock()

    def wait(self, peer: str) -> float:
        """Seconds before ``peer``'s next login is checked (0: now)."""
        with self._lock:
            entry = self._peers.get(peer)
            return max(0.0, entry[1] - self.clock()) if entry else 0.0

    def failed(self, peer: str, what: str) -> None:
        now = self.clock()
        with self._lock:
            times, _ = self._peers.pop(peer, ([], 0.0))
            times = [t for t in times if now - t < self.window] + [now]
            over = len(times) - self.free
            until = now + min(2.0 ** over, self.max_wait) if over > 0 else 0.0
            self._peers[peer] = (times, until)
            while len(self._peers) > self.peers:
                self._peers.popitem(last=False)
        log.warning("failed login from %s: %s%s", peer, what,
                    f" ({len(times)} in {self.window:.0f} s; shut out for {until - now:.0f} s)" if until else "")

    def succeeded(self, peer: str) -> None:
        with self._lock:
            self._peers.pop(peer, None)


class Users:
    """The users a node accepts, and the check of a bearer token against them."""

    def __init__(self, verifiers: dict[str, Verifier], source: str = "", failures: FailedLogins | None = None) -> None:
        self.verifiers = verifiers
        self.source = source
        self.failures = failures if failures is not None else FailedLogins()
        self._seen: OrderedDict[bytes, str | None] = OrderedDict()  # SHA-256 of a token -> its user (None: refused)
        self._lock = threading.Lock()

    @classmethod
    def load(cls, path: str | Path) -> Users:
        path = Path(path)
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as e:
            raise UsersFileError(f"cannot read the users file {str(path)!r}: {e.strerror}; "
                                 "`federator users add NAME --users-file FILE` creates it") from None
        verifiers: dict[str, Verifier] = {}
        for n, line in enumerate(lines, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, sep, text = line.partition(":")
            if not sep or not _NAME.fullmatch(name):
                raise UsersFileError(f"{path}:{n}: expected NAME:{SCHEME}$..., NAME of letters, digits and _.@- "
                                     "(up to 64); `federator users add` writes such lines")
            if name in verifiers:
                raise UsersFileError(f"{path}:{n}: user {name!r} is listed twice; keep one line per user")
            try:
                verifiers[name] = Verifier.parse(text)
            except ValueError as e:
                raise UsersFileError(f"{path}:{n}: user {name!r}: {e}; `federator users add` writes such lines") from None
        if not verifiers:
            raise UsersFileError(f"the users file {str(path)!r} lists no users; add one with "
                                 f"`federator users add NAME --users-file {path}`")
        return cls(verifiers, str(path))

    def login(self, token: str, peer: str) -> Login:
        """A bearer token's login from ``peer`` (an address), counted and logged when it fails."""
        wait = self.failures.wait(peer)
        if wait:
            return Login(None, wait)
        user = self.check(token)
        if user is None:
            self.failures.failed(peer, "a bearer token of no user")
        else:
            self.failures.succeeded(peer)
        return Login(user)

    def check(self, token: str) -> str | None:
        """The user whose token this is, or None."""
        digest = hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
        with self._lock:
            if digest in self._seen:
                self._seen.move_to_end(digest)
                return self._seen[digest]
        # every verifier, without stopping at a match: the time must not tell which user matched
        matched = [name for name, v in self.verifiers.items() if v.matches(token)]
        user = matched[0] if matched else None
        with self._lock:
            self._seen[digest] = user
            while len(self._seen) > _REMEMBERED:
                self._seen.popitem(last=False)
        return user


def bearer(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, else None."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def add_user(path: str | Path, name: str) -> str:
    """Append a new user with a fresh token to the users file (created, readable by its owner
    only, when missing) and return the token: the only time it exists outside the caller."""
    if not _NAME.fullmatch(name):
        raise UsersFileError(f"user name {name!r}: use letters, digits and _.@- (up to 64 characters)")
    path = Path(path)
    if path.exists():
        try:
            existing = Users.load(path).verifiers
        except UsersFileError as e:
            if "lists no users" not in str(e):
                raise
            existing = {}
        if name in existing:
            raise UsersFileError(f"user {name!r} is already in {str(path)!r}; remove its line first to give it a new token")
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a", encoding="utf-8") as f:
        f.write(f"{name}:{Verifier.of(token).text()}\n")
    return token
