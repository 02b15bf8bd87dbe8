"""Users files, token checks and the HTTP middleware, without a node."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

import pytest

import federator.auth
from federator.auth import FailedLogins, Users, UsersFileError, Verifier, add_user, bearer
from federator.http.bearer_auth import BearerAuth, needs_token


def test_a_verifier_is_scram_sha_256_as_rfc_5802_defines_it() -> None:
    salt = b"0123456789abcdef"
    v = Verifier.of("pencil", iterations=4096, salt=salt)
    salted = hashlib.pbkdf2_hmac("sha256", b"pencil", salt, 4096)
    assert v.stored_key == hashlib.sha256(hmac.new(salted, b"Client Key", "sha256").digest()).digest()
    assert v.server_key == hmac.new(salted, b"Server Key", "sha256").digest()
    assert v.text() == ("SCRAM-SHA-256$4096:" + base64.b64encode(salt).decode() + "$"
                        + base64.b64encode(v.stored_key).decode() + ":" + base64.b64encode(v.server_key).decode())
    assert Verifier.parse(v.text()) == v
    assert v.matches("pencil") and not v.matches("pencil ") and not v.matches("")


def test_add_user_writes_only_a_verifier_and_refuses_a_second_line_for_a_name(tmp_path) -> None:
    path = tmp_path / "users"
    a, b = add_user(path, "alice"), add_user(path, "svc.bi@team-1")
    assert a != b and len(a) >= 40
    assert a not in path.read_text() and b not in path.read_text()
    users = Users.load(path)
    assert list(users.verifiers) == ["alice", "svc.bi@team-1"]
    assert users.check(a) == "alice" and users.check(b) == "svc.bi@team-1" and users.check("guess") is None
    with pytest.raises(UsersFileError, match="already in"):
        add_user(path, "alice")
    with pytest.raises(UsersFileError, match="user name"):
        add_user(path, "no spaces")


def test_a_checked_token_is_remembered_so_a_second_check_derives_no_key(tmp_path, monkeypatch) -> None:
    path = tmp_path / "users"
    token = add_user(path, "alice")
    users = Users.load(path)
    assert users.check(token) == "alice" and users.check("wrong") is None
    monkeypatch.setattr("federator.auth.salted_password", lambda *a: pytest.fail("derived a key again"))
    assert users.check(token) == "alice" and users.check("wrong") is None


@pytest.mark.parametrize("text,says", [
    ("", "lists no users"),
    ("# only a comment\n\n", "lists no users"),
    ("alice\n", ":1: expected NAME:SCRAM-SHA-256"),
    ("al ice:SCRAM-SHA-256$4096:AA==$AA==:AA==\n", ":1: expected NAME"),
    ("alice:SCRAM-SHA-256$4096:AA==$AA==:AA==\n\nalice:SCRAM-SHA-256$4096:AA==$AA==:AA==\n", ":3: user 'alice' is listed twice"),
    ("alice:md5abc\n", ":1: user 'alice': expected SCRAM-SHA-256$"),
    ("alice:SCRAM-SHA-256$0:AA==$AA==:AA==\n", "iteration count"),
    ("alice:SCRAM-SHA-256$4096:A$AA==:AA==\n", ":1: user 'alice'"),
])
def test_a_broken_users_file_names_the_line_and_what_to_do(tmp_path, text, says) -> None:
    path = tmp_path / "users"
    path.write_text(text)
    with pytest.raises(UsersFileError, match=None) as e:
        Users.load(path)
    assert says in str(e.value), str(e.value)
    assert "federator users add" in str(e.value) or "keep one line" in str(e.value) or "iteration" in str(e.value)


def test_a_missing_users_file_says_how_to_make_one(tmp_path) -> None:
    with pytest.raises(UsersFileError, match="federator users add"):
        Users.load(tmp_path / "nope")


@pytest.mark.parametrize("header,token", [
    ("Bearer abc", "abc"), ("bearer  abc ", "abc"), ("Basic abc", None), ("Bearer", None), ("", None), (None, None),
])
def test_bearer_reads_the_authorization_header(header, token) -> None:
    assert bearer(header) == token


def test_the_middleware_guards_public_paths_and_leaves_the_open_ones(tmp_path) -> None:
    token = add_user(tmp_path / "users", "alice")
    seen = []

    def app(environ, start_response):
        seen.append(environ.get("federator.user"))
        start_response("200 OK", [])
        return [b"ok"]

    guarded = BearerAuth(app, Users.load(tmp_path / "users"))

    def call(path, auth=None):
        status = []
        env = {"PATH_INFO": path, **({"HTTP_AUTHORIZATION": auth} if auth else {})}
        body = b"".join(guarded(env, lambda s, h: status.append((s, dict(h)))))
        return status[0], body

    (status, headers), body = call("/v1/sql")
    assert status.startswith("401") and headers["WWW-Authenticate"].startswith("Bearer")
    assert json.loads(body)["error"]["code"] == "UNAUTHENTICATED"
    assert call("/v1/sql", "Bearer wrong")[0][0].startswith("401")
    assert call("/v1/sql", f"Bearer {token}") == (("200 OK", {}), b"ok") and seen == ["alice"]
    for path in ("/", "/console/console.js", "/healthz", "/readyz", "/metrics", "/internal/v1/query"):
        assert not needs_token(path) and call(path)[0][0] == "200 OK"
    for path in ("/v1/metadata", "/v1/stores", "/v1/plugins", "/console", "/internalx"):
        assert needs_token(path)


# ---- failed logins ------------------------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_new_token_is_checked_against_every_user_whether_it_matches_or_not(tmp_path, monkeypatch) -> None:
    path = tmp_path / "users"
    tokens = [add_user(path, name) for name in ("alice", "bob", "carol")]
    users = Users.load(path)
    derived: list[str] = []
    real = federator.auth.salted_password
    monkeypatch.setattr("federator.auth.salted_password", lambda t, s, i: derived.append(t) or real(t, s, i))
    assert users.check(tokens[0]) == "alice" and len(derived) == 3  # the match did not stop the others
    assert users.check("a guess") is None and len(derived) == 6


def test_a_peer_is_shut_out_after_its_free_failures_for_a_doubling_while(caplog) -> None:
    clock = Clock()
    failures = FailedLogins(free=3, window=60, max_wait=10, clock=clock)
    for _ in range(3):
        failures.failed("10.0.0.9", "a bearer token of no user")
    assert failures.wait("10.0.0.9") == 0  # a person who mistyped pays nothing
    waits = []
    for _ in range(5):
        failures.failed("10.0.0.9", "a bearer token of no user")
        waits.append(failures.wait("10.0.0.9"))
    assert waits == [2, 4, 8, 10, 10]
    assert failures.wait("10.0.0.8") == 0  # only that peer
    assert "failed login from 10.0.0.9" in caplog.text and "shut out for 10 s" in caplog.text
    clock.now += 10
    assert failures.wait("10.0.0.9") == 0
    failures.succeeded("10.0.0.9")
    failures.failed("10.0.0.9", "again")
    assert failures.wait("10.0.0.9") == 0  # a success forgot the earlier failures


def test_failures_older_than_the_window_are_forgotten_and_peers_are_bounded() -> None:
    clock = Clock()
    failures = FailedLogins(free=2, window=60, peers=3, clock=clock)
    failures.failed("a", "x")
    failures.failed("a", "x")
    clock.now += 61
    failures.failed("a", "x")
    assert failures.wait("a") == 0
    for peer in ("b", "c", "d"):
        failures.failed(peer, "x")
    assert "a" not in failures._peers and len(failures._peers) == 3


def test_a_shut_out_peer_is_refused_with_429_unchecked(tmp_path) -> None:
    path = tmp_path / "users"
    token = add_user(path, "alice")
    users = Users.load(path)
    users.failures = FailedLogins(free=1)
    app = BearerAuth(lambda environ, start: start("200 OK", []) or [b"ok"], users)
    answers = []

    def call(tok: str) -> tuple[str, dict, bytes]:
        seen: dict = {}
        body = b"".join(app({"PATH_INFO": "/v1/sql", "HTTP_AUTHORIZATION": f"Bearer {tok}", "REMOTE_ADDR": "10.1.1.1"},
                            lambda status, headers: seen.update(status=status, headers=dict(headers))))
        answers.append(seen["status"])
        return seen["status"], seen["headers"], body

    call("wrong")
    status, headers, body = call("wrong again")
    assert answers == ["401 UNAUTHORIZED", "401 UNAUTHORIZED"]
    status, headers, body = call(token)
    assert status == "429 TOO MANY REQUESTS" and int(headers["Retry-After"]) >= 1
    assert json.loads(body)["error"]["code"] == "TOO_MANY_FAILED_LOGINS"
