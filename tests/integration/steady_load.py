"""A steady load on a realtime API: clients posting back to back, every answer kept.

Shared by the tests that change an API under traffic and count what its clients saw
(test_realtime_load.py, test_autoscaling_loop.py, test_autoscaling_two_hosts.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import requests

from testbed.waiting import wait_for

REQUEST_TIMEOUT_S = 30  # a cap on any one request: no answer by then is a stuck request


@dataclass
class Answer:
    """One request of a load: when it was sent and answered, and how."""

    client: int
    sent: float            # time.monotonic()
    received: float
    status: int            # 0: no HTTP answer (the connection failed or timed out)
    body: Any
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200


class SteadyLoad:
    """`clients` threads posting to one URL back to back, each on its own connection (kept alive
    between its requests unless `keep_alive` is false); every answer is kept, in arrival order.

    `on_thread` runs first on each client's thread: there a client joins the network namespace
    of the host it sends from (tests/integration/netns_hosts.py)."""

    def __init__(self, url: str, clients: int, payload: Callable[[int], Any] = lambda n: {"n": n},
                 keep_alive: bool = True, on_thread: Callable[[], None] = lambda: None) -> None:
        self.url = url
        self._on_thread = on_thread
        # Without keep-alive every request comes on a new connection, which any of the replica's
        # processes may accept (a kept connection stays with the process that accepted it).
        self._headers = {} if keep_alive else {"Connection": "close"}
        self.answers: list[Answer] = []
        self._payload = payload
        self._counter = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(clients)]

    def _next(self) -> int:
        with self._lock:
            self._counter += 1
            return self._counter

    def _client(self, index: int) -> None:
        self._on_thread()
        session = requests.Session()
        while not self._stop.is_set():
            sent = time.monotonic()
            try:
                response = session.post(self.url, json=self._payload(self._next()), headers=self._headers,
                                        timeout=REQUEST_TIMEOUT_S)
            except requests.RequestException as e:
                self.answers.append(Answer(index, sent, time.monotonic(), 0, None, f"{type(e).__name__}: {e}"))
                session.close()
                session = requests.Session()
                continue
            try:
                body: Any = response.json()
            except ValueError:
                body = response.text
            self.answers.append(Answer(index, sent, time.monotonic(), response.status_code, body))
        session.close()

    def __enter__(self) -> SteadyLoad:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(REQUEST_TIMEOUT_S + 10)
        assert not any(t.is_alive() for t in self._threads), "a client of the load is stuck"

    def wait_for_answers(self, more: int, timeout: float, what: str,
                         check: Callable[[Answer], bool] = lambda a: True) -> None:
        """Wait until `more` further answers (that pass `check`) arrive."""
        start = len(self.answers)
        wait_for(lambda: sum(1 for a in self.answers[start:] if check(a)) >= more, timeout, what)

    def failures(self, since: int = 0) -> list[Answer]:
        return [a for a in self.answers[since:] if not a.ok]

    def wait_until_serving(self, since: int, timeout: float, what: str, run: int = 20) -> None:
        """Wait until the last `run` answers, all sent after answer `since`, succeeded."""
        def serving() -> bool:
            tail = self.answers[since:][-run:]
            return len(tail) == run and all(a.ok for a in tail)

        wait_for(serving, timeout, what)

    def last_ok(self) -> Answer:
        return next(a for a in reversed(self.answers) if a.ok)


def describe(answers: list[Answer], limit: int = 5) -> str:
    return "; ".join(f"{a.status} {a.error or a.body}" for a in answers[:limit])
