"""Beat's own scheduler, as `celery -A jobs beat` runs it: its services from the process's wiring point,
its maintenance steps on each tick, against a real redis-server (the loop and steps themselves are
driven in memory in tests/unit/test_beat_loop.py and test_beat_steps.py)."""

from __future__ import annotations

import pytest
import redis

from beat.scheduler import MaintenanceScheduler
from foundation.settings import Settings
from jobs.batch.job import Job, JobStatus
from jobs.celery_app import create_celery
from jobs.store import JobStore

T0 = 1_700_000_000.0


def test_beats_own_scheduler_times_out_a_job_on_its_tick(
    redis_client: redis.Redis, redis_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = redis_server.rsplit("/", 1)[0] + "/1"
    monkeypatch.setenv("SLUICE_REDIS_URL", url)
    store = JobStore(redis_client)
    store.create(Job(job_id="slow", api_name="iris", workers=1, config={}, timeout=30, total_batch_count=3,
                     start_time=T0), JobStatus.RUNNING)
    clock = [T0 + 10]
    scheduler = MaintenanceScheduler(create_celery(Settings(redis_url=url)), clock=lambda: clock[0])

    scheduler.tick()
    assert store.status("slow") is JobStatus.RUNNING

    clock[0] = T0 + 31
    assert scheduler.tick() == pytest.approx(5.0)  # the next round, one beat interval later
    assert store.status("slow") is JobStatus.TIMED_OUT
