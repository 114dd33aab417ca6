"""Riding out Redis stalls on a real redis-server: the store's client sends a command again for a
while, and a repeat of a store call whose reply was lost is answered as the first run was. Each
test stops a private redis-server (SIGSTOP) for a moment.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from foundation.redis_clients import connect
from jobs.batch.job import Job, JobStatus
from jobs.store import JobStore, Recorded
from sluice.embedded import free_port


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
