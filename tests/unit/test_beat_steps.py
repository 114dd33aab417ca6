"""Beat's job steps: a job past its `timeout`, or one whose enqueuer died, is ended and its workers let go."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import redis

from beat.steps import check_timeouts, fail_stalled_enqueues
from jobs.job import Job, JobStatus
from jobs.store import JobStore

T0 = 1_700_000_000.0


class RecordingPlacement:
    """Stands in for Placement: remembers which jobs were released."""

    def __init__(self) -> None:
        self.released: list[Job] = []

    def release(self, job: Job) -> None:
        self.released.append(job)


@pytest.fixture
def services(redis_client: redis.Redis) -> SimpleNamespace:
    return SimpleNamespace(store=JobStore(redis_client), placement=RecordingPlacement())


def submit(
    services: SimpleNamespace,
    job_id: str,
    timeout: int | None,
    start_time: float = T0,
    status: JobStatus = JobStatus.RUNNING,
) -> Job:
    job = Job(
        job_id=job_id,
        api_name="iris",
        workers=1,
        config={},
        timeout=timeout,
        total_batch_count=3,
        start_time=start_time,
    )
    services.store.create(job, status)
    return job


def test_a_job_past_its_timeout_is_timed_out_and_released(services: SimpleNamespace) -> None:
    job = submit(services, "slow", timeout=60)

    assert check_timeouts(services, now=T0 + 61) == ["slow"]

    state = services.store.state("slow")
    assert state.status is JobStatus.TIMED_OUT
    assert state.message == "job exceeded its timeout of 60s"
    assert state.end_time == T0 + 61
    assert services.placement.released == [job]
    assert services.store.active_ids() == []


def test_a_job_still_enqueuing_is_timed_out_too(services: SimpleNamespace) -> None:
    submit(services, "big", timeout=10, status=JobStatus.ENQUEUING)

    assert check_timeouts(services, now=T0 + 11) == ["big"]
    assert services.store.status("big") is JobStatus.TIMED_OUT


def test_a_job_is_timed_out_once_its_timeout_is_reached(services: SimpleNamespace) -> None:
    submit(services, "edge", timeout=60)

    assert check_timeouts(services, now=T0 + 59.999) == []
    assert check_timeouts(services, now=T0 + 60) == ["edge"]


def test_only_due_jobs_are_touched(services: SimpleNamespace) -> None:
    due = submit(services, "due", timeout=60)
    submit(services, "not-yet", timeout=60, start_time=T0 + 30)
    submit(services, "no-timeout", timeout=None, start_time=T0 - 86_400)
    done = submit(services, "done", timeout=10)
    services.store.transition(done.job_id, JobStatus.SUCCEEDED, now=T0 + 5)

    assert check_timeouts(services, now=T0 + 61) == ["due"]

    assert services.store.statuses(["due", "not-yet", "no-timeout", "done"]) == {
        "due": JobStatus.TIMED_OUT,
        "not-yet": JobStatus.RUNNING,
        "no-timeout": JobStatus.RUNNING,
        "done": JobStatus.SUCCEEDED,
    }
    assert services.store.state("done").end_time == T0 + 5
    assert services.placement.released == [due]


def test_a_job_that_ended_while_listed_as_active_is_not_timed_out(services: SimpleNamespace) -> None:
    submit(services, "stopped", timeout=10, status=JobStatus.STOPPED)  # created ended: still in the active set

    assert check_timeouts(services, now=T0 + 100) == []
    assert services.store.status("stopped") is JobStatus.STOPPED
    assert services.placement.released == []


def test_a_job_is_timed_out_and_released_only_once_however_often_the_step_runs(
    services: SimpleNamespace,
) -> None:
    submit(services, "slow", timeout=60)

    assert check_timeouts(services, now=T0 + 61) == ["slow"]
    assert check_timeouts(services, now=T0 + 62) == []
    assert check_timeouts(services, now=T0 + 3600) == []

    assert len(services.placement.released) == 1
    assert services.store.state("slow").end_time == T0 + 61


def test_an_active_job_whose_record_vanished_is_skipped(
    services: SimpleNamespace, redis_client: redis.Redis
) -> None:
    submit(services, "gone", timeout=1)
    submit(services, "slow", timeout=1)
    redis_client.delete("sluice:job:gone")  # expired between listing and reading

    assert check_timeouts(services, now=T0 + 10) == ["slow"]


def test_nothing_happens_when_no_job_is_active(services: SimpleNamespace) -> None:
    assert check_timeouts(services, now=T0) == []
    assert services.placement.released == []


# -- jobs whose enqueuer died -----------------------------------------------------------------
STALE_S = 60.0


def test_a_job_whose_enqueuer_went_silent_fails_with_a_message_and_is_released(services: SimpleNamespace) -> None:
    submit(services, "orphan", timeout=None, status=JobStatus.ENQUEUING)
    services.store.touch_enqueue("orphan", T0 + 5)  # the last sign of life of its API process

    assert fail_stalled_enqueues(services, now=T0 + 5 + STALE_S, stale_after_s=STALE_S) == []
    assert fail_stalled_enqueues(services, now=T0 + 6 + STALE_S, stale_after_s=STALE_S) == ["orphan"]

    state = services.store.state("orphan")
    assert state.status is JobStatus.ENQUEUE_FAILED
    assert "enqueueing stopped" in state.message and "submit the job again" in state.message
    assert [job.job_id for job in services.placement.released] == ["orphan"]


def test_an_enqueuer_that_keeps_touching_its_job_is_left_alone(services: SimpleNamespace) -> None:
    submit(services, "big-input", timeout=None, status=JobStatus.ENQUEUING)
    for minute in range(1, 10):
        services.store.touch_enqueue("big-input", T0 + minute * 50)
        assert fail_stalled_enqueues(services, now=T0 + minute * 50 + 30, stale_after_s=STALE_S) == []

    assert services.store.status("big-input") is JobStatus.ENQUEUING


def test_only_enqueueing_jobs_are_judged_by_their_enqueuer(services: SimpleNamespace) -> None:
    submit(services, "running", timeout=None, status=JobStatus.RUNNING)
    submit(services, "never-touched", timeout=None, start_time=T0, status=JobStatus.ENQUEUING)

    assert fail_stalled_enqueues(services, now=T0 + 2 * STALE_S, stale_after_s=STALE_S) == ["never-touched"]
    assert services.store.status("running") is JobStatus.RUNNING


# -- one bad record is skipped, never fatal to the step -----------------------------------------
def test_a_job_whose_timeout_overflows_is_skipped_and_the_others_still_time_out(services: SimpleNamespace) -> None:
    submit(services, "a-huge", timeout=10**401)  # accepted before the submission's bounds existed
    submit(services, "b-due", timeout=60)

    assert check_timeouts(services, now=T0 + 61) == ["b-due"]

    assert services.store.status("b-due") is JobStatus.TIMED_OUT
    assert services.store.status("a-huge") is JobStatus.RUNNING


def test_a_corrupt_job_record_is_skipped_and_the_others_still_time_out(
    services: SimpleNamespace, redis_client: redis.Redis
) -> None:
    submit(services, "a-corrupt", timeout=1)
    submit(services, "b-broken-fields", timeout=1)
    submit(services, "c-due", timeout=60)
    redis_client.hset("sluice:job:a-corrupt", "record", "{not json")
    redis_client.hset("sluice:job:b-broken-fields", "record", '{"job_id": "b-broken-fields", "timeout": "soon"}')

    assert check_timeouts(services, now=T0 + 61) == ["c-due"]
    assert services.store.status("c-due") is JobStatus.TIMED_OUT


def test_a_job_whose_release_fails_does_not_keep_the_next_from_timing_out(services: SimpleNamespace) -> None:
    class FailingOnce(RecordingPlacement):
        def release(self, job: Job) -> None:
            if not self.released:
                self.released.append(job)
                raise ValueError("a bug releasing the first job")
            super().release(job)

    services.placement = FailingOnce()
    submit(services, "a-first", timeout=1)
    submit(services, "b-second", timeout=1)

    assert check_timeouts(services, now=T0 + 5) == ["b-second"]
    assert services.store.statuses(["a-first", "b-second"]) == {
        "a-first": JobStatus.TIMED_OUT, "b-second": JobStatus.TIMED_OUT,
    }


def test_a_stalled_enqueue_is_failed_even_beside_a_corrupt_record(
    services: SimpleNamespace, redis_client: redis.Redis
) -> None:
    submit(services, "a-corrupt", timeout=None, status=JobStatus.ENQUEUING)
    submit(services, "b-orphan", timeout=None, status=JobStatus.ENQUEUING)
    redis_client.hset("sluice:job:a-corrupt", "enqueue_seen", "not a time")

    assert fail_stalled_enqueues(services, now=T0 + 2 * STALE_S, stale_after_s=STALE_S) == ["b-orphan"]
