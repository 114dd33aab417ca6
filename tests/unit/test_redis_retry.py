"""Riding out Redis stalls: a command is sent again for a while, and a repeat of a store call whose reply
was lost is answered as the first run was. The stall tests stop a private redis-server (SIGSTOP)."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest
import redis

from jobs.job import Job, JobStatus
from foundation.redis_clients import RedisUnavailable, RideOut, connect, one_line
from foundation.settings import Settings
from jobs.store import JobStore, Recorded
from foundation.errors import BadRequest, NotReady
from sluice.embedded import free_port


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def failing(times: int, error: Exception, clock: FakeClock | None = None, cost_s: float = 0.0):
    calls = {"n": 0}

    def call() -> str:
        calls["n"] += 1
        if clock is not None:
            clock.now += cost_s
        if calls["n"] <= times:
            raise error
        return "answered"

    return call, calls


def test_a_command_is_sent_again_with_growing_pauses_until_redis_answers() -> None:
    clock = FakeClock()
    retry = RideOut(30, sleep=clock.sleep, clock=clock)
    call, calls = failing(6, redis.ConnectionError("refused"))
    failures: list[Exception] = []

    assert retry.call_with_retry(call, failures.append) == "answered"

    assert calls["n"] == 7 and len(failures) == 6
    assert clock.slept == sorted(clock.slept) and clock.slept[0] == pytest.approx(0.05)
    assert max(clock.slept) <= 1.0


def test_redis_unanswered_for_the_whole_window_is_reported_in_one_line() -> None:
    clock = FakeClock()
    retry = RideOut(30, sleep=clock.sleep, clock=clock)
    call, calls = failing(1000, redis.TimeoutError("Timeout reading from socket"), clock, cost_s=5.0)

    with pytest.raises(RedisUnavailable) as raised:
        retry.call_with_retry(call, lambda error: None)

    assert 30 <= clock.now <= 30 + 5 + 1  # tries of 5 s each (a socket timeout) fill the window, one more at most
    assert calls["n"] in (6, 7)
    assert str(raised.value) == "Redis did not answer for 30 s (TimeoutError: Timeout reading from socket)"
    assert isinstance(raised.value, NotReady) and isinstance(raised.value, redis.ConnectionError)
    assert isinstance(raised.value.__cause__, redis.TimeoutError)


def test_a_wrong_password_is_not_retried() -> None:
    clock = FakeClock()
    call, calls = failing(5, redis.AuthenticationError("invalid password"))

    with pytest.raises(redis.AuthenticationError):
        RideOut(30, sleep=clock.sleep, clock=clock).call_with_retry(call, lambda error: None)

    assert calls["n"] == 1


def test_a_command_redis_refuses_is_not_retried() -> None:
    call, calls = failing(5, redis.ResponseError("WRONGTYPE"))

    with pytest.raises(redis.ResponseError):
        RideOut(30, sleep=lambda s: None).call_with_retry(call, lambda error: None)

    assert calls["n"] == 1


def test_what_went_wrong_is_said_in_one_line() -> None:
    assert one_line(BadRequest("line 3 of s3://b/x.jsonl is not JSON")) == "line 3 of s3://b/x.jsonl is not JSON"
    assert one_line(redis.TimeoutError("Timeout reading\nfrom socket")) == (
        "Redis failed: TimeoutError: Timeout reading from socket"
    )
    assert one_line(ValueError()) == "ValueError"


# -- a real Redis that stalls ----------------------------------------------------------------------
@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A redis-server of this test alone, since the test stops it."""
    port = free_port()
    process = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path), "--save", "",
         "--appendonly", "no"], stdout=subprocess.DEVNULL,
    )
    process.url = f"redis://127.0.0.1:{port}/0"  # type: ignore[attr-defined]
    client = redis.Redis(port=port)
    for _ in range(200):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.02)
    yield process
    os.kill(process.pid, signal.SIGCONT)
    process.terminate()
    process.wait(timeout=10)


def stall(process: subprocess.Popen[bytes], seconds: float) -> threading.Timer:
    os.kill(process.pid, signal.SIGSTOP)
    waker = threading.Timer(seconds, os.kill, args=(process.pid, signal.SIGCONT))
    waker.start()
    return waker


def test_the_recording_that_completes_a_job_is_told_so_though_redis_stalled_past_its_socket_timeout(
    own_redis: subprocess.Popen[bytes],
) -> None:
    # A socket timeout shorter than the stall: the first reply is lost while Redis, once awake,
    # still runs the recording; the repeat must hear "completed", or no one would complete the job.
    store = JobStore(connect(own_redis.url, 10, socket_timeout=0.3))  # type: ignore[attr-defined]
    job = Job(job_id="j", api_name="iris", workers=1, config={}, timeout=None, total_batch_count=2, start_time=0.0)
    store.create(job, JobStatus.RUNNING)
    store.seal("j", 2)
    store.record_success("j", 0, 0.1)

    waker = stall(own_redis, 1.0)
    recorded = store.record_success("j", 1, 0.1)
    waker.join()

    assert recorded is Recorded.COMPLETED_JOB
    assert store.state("j").succeeded == 2


def test_a_transition_repeated_after_a_stall_reports_that_it_moved_the_job(own_redis: subprocess.Popen[bytes]) -> None:
    store = JobStore(connect(own_redis.url, 10, socket_timeout=0.3))  # type: ignore[attr-defined]
    job = Job(job_id="j", api_name="iris", workers=1, config={}, timeout=None, total_batch_count=1, start_time=0.0)
    store.create(job, JobStatus.ENQUEUING)

    waker = stall(own_redis, 1.0)
    moved = store.transition("j", JobStatus.RUNNING, allowed_from=[JobStatus.ENQUEUING])
    waker.join()

    assert moved is True  # else the enqueuer would think the job was stopped meanwhile and drop its queue
    assert store.status("j") is JobStatus.RUNNING


def test_the_retry_window_is_a_setting_of_30_seconds_by_default() -> None:
    assert Settings.from_env({}).redis_retry_s == 30
    assert Settings.from_env({"SLUICE_REDIS_RETRY_S": "5"}).redis_retry_s == 5
