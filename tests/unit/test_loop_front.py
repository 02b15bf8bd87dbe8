"""The HTTP front under granian (federator.http.loop_front): what may not wait is answered on
the event loop's thread; what would wait reaches the WSGI app on a thread, body and all, and
gets the same answer it would have had there."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

from federator.http.loop_front import INLINE_EXTENSION, LoopFront
from federator.sql.inline import inline_only, refuse_waiting


class App:
    """A WSGI app that echoes its body and says where it ran; with ``wait`` set it would wait
    (refuses to run inline), as a query that needs a slot or another node does."""

    def __init__(self, wait: bool = False, fail_after: int | None = None) -> None:
        self.wait, self.fail_after = wait, fail_after
        self.extensions = {INLINE_EXTENSION: lambda method, path: path == "/v1/sql"}
        self.calls: list[dict[str, Any]] = []

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        body = environ["wsgi.input"].read()
        self.calls.append({"inline": inline_only(), "thread": threading.current_thread().name})
        if self.wait:
            refuse_waiting("a test's wait")
        start_response("200 OK", [("Content-Type", "application/json")])
        answer = json.dumps({"body": body.decode(), "inline": inline_only()}).encode()
        if self.fail_after is None:
            return [answer]
        return self._failing(answer)

    def _failing(self, answer: bytes) -> Any:
        yield answer[: self.fail_after]
        raise RuntimeError("the answer failed after it had begun")


def _request(front: LoopFront, path: str, body: bytes, parts: int = 1) -> tuple[int, bytes, list[dict[str, Any]]]:
    """``body`` sent to ``front`` in ``parts`` messages; the status, the whole answer and the
    messages sent."""
    size = max(1, -(-len(body) // parts))
    chunks = [body[i:i + size] for i in range(0, len(body), size)] or [b""]
    incoming = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
    sent: list[dict[str, Any]] = []

    def receive() -> Any:  # granian's receive gives an awaitable that is not a coroutine
        future = asyncio.get_running_loop().create_future()
        future.set_result(incoming.pop(0) if incoming else {"type": "http.disconnect"})
        return future

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "query_string": b"", "http_version": "1.1",
             "headers": [(b"content-type", b"application/json")], "server": ("127.0.0.1", 80)}
    asyncio.run(front(scope, receive, send))
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    data = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, data, sent


def test_a_request_that_need_not_wait_is_answered_on_the_loop() -> None:
    app = App()
    status, data, _ = _request(LoopFront(app, threads=2), "/v1/sql", b'{"sql": "SELECT 1"}')
    assert status == 200 and json.loads(data) == {"body": '{"sql": "SELECT 1"}', "inline": True}
    assert app.calls == [{"inline": True, "thread": threading.current_thread().name}]


def test_a_request_that_would_wait_goes_to_a_thread_with_its_whole_body() -> None:
    app = App(wait=True)
    body = json.dumps({"sql": "SELECT " + "1, " * 10 + "1"}).encode()
    status, data, _ = _request(LoopFront(app, threads=2), "/v1/sql", body, parts=3)
    assert status == 200 and json.loads(data)["body"] == body.decode()
    first, second = app.calls
    assert first["inline"] and not second["inline"] and second["thread"] != first["thread"]


def test_other_routes_and_large_bodies_go_to_threads_only() -> None:
    app = App()
    _, data, _ = _request(LoopFront(app, threads=2), "/internal/v1/query", b'{"store": "s"}', parts=2)
    assert json.loads(data) == {"body": '{"store": "s"}', "inline": False} and len(app.calls) == 1

    app = App()
    big = b"x" * (200 * 1024)  # over what the loop reads before handing a request on
    _, data, _ = _request(LoopFront(app, threads=2), "/v1/sql", big, parts=8)
    assert json.loads(data) == {"body": big.decode(), "inline": False} and len(app.calls) == 1


def test_a_failure_after_the_answer_began_ends_the_body_on_the_loop_and_on_threads() -> None:
    for wait in (False, True):
        app = App(wait=wait, fail_after=5)
        status, data, sent = _request(LoopFront(app, threads=2), "/v1/sql", b"{}")
        assert status == 200 and data == b'{"bod'  # what had been written, then a normal end
        assert sent[-1]["type"] == "http.response.body" and not sent[-1].get("more_body", False)


def test_without_the_fast_path_nothing_runs_on_the_loop() -> None:
    app = App()
    app.extensions = {}
    _, data, _ = _request(LoopFront(app, threads=2), "/v1/sql", b"{}")
    assert json.loads(data)["inline"] is False and app.calls[0]["thread"] != threading.current_thread().name
