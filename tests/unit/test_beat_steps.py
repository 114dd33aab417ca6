"""Beat's job steps: a job past its `timeout`, or one whose enqueuer died, is ended and its workers let go.

Fast: the job store is the in-memory one (it keeps the store's contract), placement runs over it and
the in-memory node registry, remembering which jobs it released; each step is driven with `now`.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from beat.steps import check_timeouts, fail_stalled_enqueues, wake_queued_requests
from foundation.memory import MemoryApiRegistry
from jobs.asyncapi.memory import MemoryAsyncRequests
from jobs.asyncapi.request import AsyncRequest, PayloadKind, RequestStatus
from jobs.batch.job import Job, JobStatus
from jobs.nodes.memory import MemoryNodes
from jobs.placement.batch import Placement
from jobs.store import JobField
from jobs.store.memory import MemoryJobStore
from jobs.transport.memory import MemoryJobQueues
from predictors_runtime.config import ApiConfig

T0 = 1_700_000_000.0


class RecordingPlacement(Placement):
    """Placement over the in-memory fakes that remembers which jobs were released."""

    def __init__(self, store: MemoryJobStore) -> None:
        super().__init__(MemoryJobQueues(), store, MemoryNodes(15.0, inflight=store.inflight))
        self.released: list[Job] = []

    def release(self, job: Job, nodes: list[str] | None = None) -> None:
        self.released.append(job)
        super().release(job, nodes)


@dataclass
class Beat:
    """What beat's steps are handed: the job store and placement."""

    store: MemoryJobStore
    placement: RecordingPlacement

    def check_timeouts(self, now: float) -> list[str]:
        return check_timeouts(self.store, self.placement, now)

    def fail_stalled_enqueues(self, now: float, stale_after_s: float) -> list[str]:
        return fail_stalled_enqueues(self.store, self.placement, now, stale_after_s)


@pytest.fixture
def services() -> Beat:
    store = MemoryJobStore()
    return Beat(store, RecordingPlacement(store))


def submit(
    services: Beat,
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


def test_a_job_past_its_timeout_is_timed_out_and_released(services: Beat) -> None:
    job = submit(services, "slow", timeout=60)

    assert services.check_timeouts(now=T0 + 61) == ["slow"]

    state = services.store.state("slow")
    assert state.status is JobStatus.TIMED_OUT
    assert state.message == "job exceeded its timeout of 60s"
    assert state.end_time == T0 + 61
    assert services.placement.released == [job]
    assert services.store.active_ids() == []


def test_a_job_still_enqueuing_is_timed_out_too(services: Beat) -> None:
    submit(services, "big", timeout=10, status=JobStatus.ENQUEUING)

    assert services.check_timeouts(now=T0 + 11) == ["big"]
    assert services.store.status("big") is JobStatus.TIMED_OUT


def test_a_job_is_timed_out_once_its_timeout_is_reached(services: Beat) -> None:
    submit(services, "edge", timeout=60)

    assert services.check_timeouts(now=T0 + 59.999) == []
    assert services.check_timeouts(now=T0 + 60) == ["edge"]


def test_only_due_jobs_are_touched(services: Beat) -> None:
    due = submit(services, "due", timeout=60)
    submit(services, "not-yet", timeout=60, start_time=T0 + 30)
    submit(services, "no-timeout", timeout=None, start_time=T0 - 86_400)
    done = submit(services, "done", timeout=10)
    services.store.transition(done.job_id, JobStatus.SUCCEEDED, now=T0 + 5)

    assert services.check_timeouts(now=T0 + 61) == ["due"]

    assert services.store.statuses(["due", "not-yet", "no-timeout", "done"]) == {
        "due": JobStatus.TIMED_OUT,
        "not-yet": JobStatus.RUNNING,
        "no-timeout": JobStatus.RUNNING,
        "done": JobStatus.SUCCEEDED,
    }
    assert services.store.state("done").end_time == T0 + 5
    assert services.placement.released == [due]


def test_a_job_that_ended_while_listed_as_active_is_not_timed_out(services: Beat) -> None:
    submit(services, "stopped", timeout=10, status=JobStatus.STOPPED)  # created ended: still in the active set

    assert services.check_timeouts(now=T0 + 100) == []
    assert services.store.status("stopped") is JobStatus.STOPPED
    assert services.placement.released == []


def test_a_job_is_timed_out_and_released_only_once_however_often_the_step_runs(
    services: Beat,
) -> None:
    submit(services, "slow", timeout=60)

    assert services.check_timeouts(now=T0 + 61) == ["slow"]
    assert services.check_timeouts(now=T0 + 62) == []
    assert services.check_timeouts(now=T0 + 3600) == []

    assert len(services.placement.released) == 1
    assert services.store.state("slow").end_time == T0 + 61


def test_an_active_job_whose_record_vanished_is_skipped(services: Beat) -> None:
    submit(services, "gone", timeout=1)
    submit(services, "slow", timeout=1)
    services.store.hash_of("gone").clear()  # expired between listing and reading (the fake's hash is Redis's)

    assert services.check_timeouts(now=T0 + 10) == ["slow"]


def test_nothing_happens_when_no_job_is_active(services: Beat) -> None:
    assert services.check_timeouts(now=T0) == []
    assert services.placement.released == []


# -- jobs whose enqueuer died -----------------------------------------------------------------
STALE_S = 60.0


def test_a_job_whose_enqueuer_went_silent_fails_with_a_message_and_is_released(services: Beat) -> None:
    submit(services, "orphan", timeout=None, status=JobStatus.ENQUEUING)
    services.store.touch_enqueue("orphan", T0 + 5)  # the last sign of life of its API process

    assert services.fail_stalled_enqueues(now=T0 + 5 + STALE_S, stale_after_s=STALE_S) == []
    assert services.fail_stalled_enqueues(now=T0 + 6 + STALE_S, stale_after_s=STALE_S) == ["orphan"]

    state = services.store.state("orphan")
    assert state.status is JobStatus.ENQUEUE_FAILED
    assert "enqueueing stopped" in state.message and "submit the job again" in state.message
    assert [job.job_id for job in services.placement.released] == ["orphan"]


def test_an_enqueuer_that_keeps_touching_its_job_is_left_alone(services: Beat) -> None:
    submit(services, "big-input", timeout=None, status=JobStatus.ENQUEUING)
    for minute in range(1, 10):
        services.store.touch_enqueue("big-input", T0 + minute * 50)
        assert services.fail_stalled_enqueues(now=T0 + minute * 50 + 30, stale_after_s=STALE_S) == []

    assert services.store.status("big-input") is JobStatus.ENQUEUING


def test_only_enqueueing_jobs_are_judged_by_their_enqueuer(services: Beat) -> None:
    submit(services, "running", timeout=None, status=JobStatus.RUNNING)
    submit(services, "never-touched", timeout=None, start_time=T0, status=JobStatus.ENQUEUING)

    assert services.fail_stalled_enqueues(now=T0 + 2 * STALE_S, stale_after_s=STALE_S) == ["never-touched"]
    assert services.store.status("running") is JobStatus.RUNNING


# -- one bad record is skipped, never fatal to the step -----------------------------------------
def test_a_job_whose_timeout_overflows_is_skipped_and_the_others_still_time_out(services: Beat) -> None:
    submit(services, "a-huge", timeout=10**401)  # accepted before the submission's bounds existed
    submit(services, "b-due", timeout=60)

    assert services.check_timeouts(now=T0 + 61) == ["b-due"]

    assert services.store.status("b-due") is JobStatus.TIMED_OUT
    assert services.store.status("a-huge") is JobStatus.RUNNING


def test_a_corrupt_job_record_is_skipped_and_the_others_still_time_out(services: Beat) -> None:
    submit(services, "a-corrupt", timeout=1)
    submit(services, "b-broken-fields", timeout=1)
    submit(services, "c-due", timeout=60)
    services.store.hash_of("a-corrupt")[JobField.RECORD] = "{not json"
    services.store.hash_of("b-broken-fields")[JobField.RECORD] = '{"job_id": "b-broken-fields", "timeout": "soon"}'

    assert services.check_timeouts(now=T0 + 61) == ["c-due"]
    assert services.store.status("c-due") is JobStatus.TIMED_OUT


def test_a_job_whose_release_fails_does_not_keep_the_next_from_timing_out(services: Beat) -> None:
    class FailingOnce(RecordingPlacement):
        def release(self, job: Job, nodes: list[str] | None = None) -> None:
            if not self.released:
                self.released.append(job)
                raise ValueError("a bug releasing the first job")
            super().release(job, nodes)

    services.placement = FailingOnce(services.store)
    submit(services, "a-first", timeout=1)
    submit(services, "b-second", timeout=1)

    assert services.check_timeouts(now=T0 + 5) == ["b-second"]
    assert services.store.statuses(["a-first", "b-second"]) == {
        "a-first": JobStatus.TIMED_OUT, "b-second": JobStatus.TIMED_OUT,
    }


def test_a_stalled_enqueue_is_failed_even_beside_a_corrupt_record(services: Beat) -> None:
    submit(services, "a-corrupt", timeout=None, status=JobStatus.ENQUEUING)
    submit(services, "b-orphan", timeout=None, status=JobStatus.ENQUEUING)
    services.store.hash_of("a-corrupt")[JobField.ENQUEUE_SEEN] = "not a time"

    assert services.fail_stalled_enqueues(now=T0 + 2 * STALE_S, stale_after_s=STALE_S) == ["b-orphan"]


def test_beat_sends_a_task_for_queued_async_requests_that_have_none_on_its_way() -> None:
    registry = MemoryApiRegistry()
    for name in ("summarise", "idle"):
        registry.put(ApiConfig.model_validate({"name": name, "kind": "AsyncAPI", "predictor": {
            "path": "p.py", "server_side_batching": {"max_batch_size": 4, "batch_interval": 0.1}}}), "b1", now=1.0)
    requests = MemoryAsyncRequests()
    requests.create(AsyncRequest("summarise", "r1", RequestStatus.IN_QUEUE, PayloadKind.JSON, 1.0, payload=b"1"), 1.0)
    assert requests.queue("summarise", "r1")  # its submitter died before sending the task
    sent: list[str] = []

    assert wake_queued_requests(registry, requests, sent.append) == []
    requests.woken("summarise")  # the key set for the lost task is gone (its expiry, in Redis)
    assert wake_queued_requests(registry, requests, sent.append) == [
        "summarise"]
    assert sent == ["summarise"]
    assert wake_queued_requests(registry, requests, sent.append) == []
