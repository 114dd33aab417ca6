"""The client backs off and tries again when refused with 503 + Retry-After, and only then.

Against a real HTTP server on 127.0.0.1 (http.server in a thread) that answers a script of
refusals and then 200; the client's waits go to a recorder (with a fake clock) instead of sleeping.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from sluice.client import Client, ClientError, NotReady, Overloaded, RetryPolicy

OVERLOADED = {"kind": "overloaded", "message": "ap is at capacity: every replica is busy and its queue is full"}


class Scripted:
    """A server answering each request with the next (status, headers, body) of its script, then 200."""

    def __init__(self) -> None:
        self.script: list[tuple[int, dict[str, str], dict[str, Any]]] = []
        self.seen: list[tuple[str, str, bytes]] = []
        self.lock = threading.Lock()
        scripted = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with scripted.lock:
                    scripted.seen.append((self.command, self.path, body))
                    status, headers, answer = (scripted.script.pop(0) if scripted.script
                                               else (200, {}, {"ok": True, "body": body.decode()}))
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
        self.thread.start()

    def refuse(self, times: int, retry_after: str | None = "1", kind: str = "overloaded") -> None:
        headers = {"Retry-After": retry_after} if retry_after is not None else {}
        self.script += [(503, headers, {**OVERLOADED, "kind": kind})] * times

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def server() -> Iterator[Scripted]:
    scripted = Scripted()
    yield scripted
    scripted.close()


class Waits:
    """Stands in for time.sleep and time.monotonic: records each wait and moves a fake clock by it."""

    def __init__(self) -> None:
        self.now = 0.0
        self.waits: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds

    def clock(self) -> float:
        return self.now


def client(url: str, waits: Waits, jitter_draw: float = 0.0, **policy: Any) -> Client:
    return Client(url, retries=RetryPolicy(sleep=waits.sleep, clock=waits.clock, random=lambda: jitter_draw,
                                           **policy))


def test_a_refused_request_is_tried_again_after_retry_after_until_it_is_let_in(server):
    server.refuse(2, retry_after="2")
    waits = Waits()

    answer = client(server.url, waits).predict("ap", {"x": 1})

    assert answer == {"ok": True, "body": '{"x": 1}'}
    # The same POST, sent three times: a refused request never ran, so sending it again is safe.
    assert server.seen == [("POST", "/ap", b'{"x": 1}')] * 3
    assert waits.waits == [2.0, 2.0]


def test_waits_grow_exponentially_when_retry_after_is_shorter_than_the_backoff(server):
    server.refuse(3, retry_after="0")
    waits = Waits()

    client(server.url, waits, backoff=0.5).readiness("ap")

    assert waits.waits == [0.5, 1.0, 2.0]
    assert len(server.seen) == 4


def test_jitter_stretches_a_wait_never_shortens_it(server):
    server.refuse(1, retry_after="2")
    waits = Waits()

    client(server.url, waits, jitter_draw=1.0, jitter=0.5).readiness("ap")

    assert waits.waits == [3.0]


def test_after_the_last_retry_the_refusal_is_raised_as_overloaded(server):
    server.refuse(10)
    waits = Waits()

    with pytest.raises(Overloaded) as raised:
        client(server.url, waits, retries=2).predict("ap", {"x": 1})

    assert (raised.value.http_status, raised.value.kind) == (503, "overloaded")
    assert len(server.seen) == 3 and waits.waits == [1.0, 1.0]


def test_a_long_retry_after_is_capped_and_the_total_wait_is_bounded(server):
    server.refuse(10, retry_after="3600")
    waits = Waits()

    with pytest.raises(Overloaded):
        client(server.url, waits, retries=10, max_wait=4.0, max_total=10.0).readiness("ap")

    # 4 + 4 fit in 10 s; a third 4 s wait would end past them, so it is not taken.
    assert waits.waits == [4.0, 4.0]
    assert len(server.seen) == 3


def test_a_retry_after_date_is_honoured_as_the_seconds_until_then(server):
    server.refuse(1, retry_after=formatdate(0, usegmt=True))  # long past: no wait beyond the backoff
    waits = Waits()

    client(server.url, waits, backoff=0.25).readiness("ap")

    assert waits.waits == [0.25] and len(server.seen) == 2


def test_a_503_without_retry_after_is_raised_at_once(server):
    server.refuse(1, retry_after=None, kind="not_ready")
    waits = Waits()

    with pytest.raises(NotReady) as raised:
        client(server.url, waits).readiness("ap")

    assert raised.value.kind == "not_ready" and not isinstance(raised.value, Overloaded)
    assert len(server.seen) == 1 and waits.waits == []


def test_a_retry_after_that_is_not_a_time_is_raised_at_once(server):
    server.refuse(1, retry_after="soon")
    waits = Waits()

    with pytest.raises(Overloaded):
        client(server.url, waits).readiness("ap")

    assert len(server.seen) == 1 and waits.waits == []


def test_other_errors_are_never_retried(server):
    server.script.append((500, {"Retry-After": "1"}, {"kind": "predictor_error", "message": "boom"}))
    waits = Waits()

    with pytest.raises(ClientError) as raised:
        client(server.url, waits).predict("ap", {})

    assert raised.value.http_status == 500 and len(server.seen) == 1 and waits.waits == []


def test_retries_zero_disables_retrying(server):
    server.refuse(1)

    with pytest.raises(Overloaded):
        Client(server.url, retries=0).predict("ap", {})

    assert len(server.seen) == 1


def test_an_int_sets_the_number_of_retries_and_the_default_retries(server):
    assert Client(server.url, retries=5).retry_policy.retries == 5
    assert Client(server.url).retry_policy.retries > 0
    with pytest.raises(ValueError, match="cannot be negative"):
        RetryPolicy(retries=-1)
