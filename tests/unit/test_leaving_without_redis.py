"""A node that is stopping while Redis is away ends instead of waiting for it (`jobs/store/answers.py`):
its batch is left as a killed node's is, to be given back once Redis is there."""

from __future__ import annotations

import pytest
import redis

from jobs.store import answers


class Exited(Exception):
    pass


def test_a_store_call_rides_out_redis_until_the_node_is_stopping_then_the_node_ends(monkeypatch) -> None:
    stopping = {"now": False}
    exits: list[int] = []
    monkeypatch.setattr(answers, "riding_out_stopped", lambda: stopping["now"])
    monkeypatch.setattr(answers.time, "sleep", lambda seconds: stopping.update(now=True))  # stopped while it waits

    def exit_now(status: int) -> None:
        exits.append(status)
        raise Exited

    monkeypatch.setattr(answers.os, "_exit", exit_now)
    calls = []

    def away() -> str:
        calls.append(1)
        raise redis.ConnectionError("refused")

    with pytest.raises(Exited):
        answers.until_answered("recording batch 3 of job j1", away)

    assert len(calls) == 2  # waited once while the node ran, then tried once more and ended
    assert exits == [answers.EXIT_LEFT_WITHOUT_REDIS]


def test_a_store_call_that_gets_its_answer_never_ends_the_node(monkeypatch) -> None:
    monkeypatch.setattr(answers, "riding_out_stopped", lambda: True)
    assert answers.until_answered("beginning batch 0 of job j1", lambda: "ok") == "ok"
