"""A job's completion: `on_job_complete` runs at most once however often the completion task comes, a
Redis error is waited out rather than taken for a vanished job, and beat sends the completion again
for a job whose batches are all recorded but which has not ended."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import redis

from beat.completions import COMPLETION_GRACE_S, completion_grace_s, resend_completions
from jobs.completion import DIED_MESSAGE, finish_job
from jobs.job import Job, JobStatus
from foundation.settings import Settings
from jobs.nodes import Delivery, Nodes
from jobs.store import JobStore
from jobs.tasks import FINISH_JOB
from foundation.errors import PredictorError

T0 = 1_700_000_000.0
GRACE_S = 10.0


class RecordingPlacement:
    def __init__(self) -> None:
        self.released: list[str] = []

    def release(self, job: Job, nodes: list[str] | None = None) -> None:
        self.released.append(job.job_id)


class RecordingCelery:
    """Stands in for the Celery app: remembers the tasks sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, tuple[Any, ...], str]] = []

    def send_task(self, name: str, args: tuple[Any, ...], queue: str, **_: Any) -> None:
        self.sent.append((name, args, queue))


class Predictor:
    def __init__(self, raises: bool = False) -> None:
        self.completed: list[dict[str, Any]] = []
        self.raises = raises

    def on_job_complete(self, job_status: dict[str, Any]) -> None:
        self.completed.append(job_status)
        if self.raises:
            raise ValueError("the summary could not be written")


class Runtime:
    """Stands in for `WorkerRuntime`: one predictor per job, and what it forgot."""

    def __init__(self, services: SimpleNamespace, predictor: Predictor | None = None, build_error: str = "") -> None:
        self.services = services
        self.predictor = predictor or Predictor()
        self.build_error = build_error
        self.forgotten: list[str] = []

    def predictor_for(self, job: Job) -> Predictor:
        if self.build_error:
            raise PredictorError(self.build_error)
        return self.predictor

    def forget(self, job_id: str) -> None:
        self.forgotten.append(job_id)


@pytest.fixture
def services(redis_client: redis.Redis) -> SimpleNamespace:
    celery = RecordingCelery()
    return SimpleNamespace(store=JobStore(redis_client), nodes=Nodes(redis_client, celery, node_ttl_s=30),  # type: ignore[arg-type]
                           placement=RecordingPlacement(), celery=celery)


def finished_job(services: SimpleNamespace, job_id: str = "job-1", recorded_at: float = T0, failed: int = 0) -> Job:
    """A running job whose two batches are recorded (the last of them at `recorded_at`)."""
    job = Job(job_id=job_id, api_name="iris", workers=1, config={}, timeout=None, total_batch_count=2,
              start_time=T0 - 60)
    store = services.store
    store.create(job, JobStatus.RUNNING)
    for index in range(2):
        if index < failed:
            store.record_failure(job_id, index, 0.1, "boom", 1, [index])
        else:
            store.record_success(job_id, index, 0.1)
    assert store.seal(job_id, 2, now=recorded_at)
    return job


def delivery(task_id: str = "task-1") -> Delivery:
    return Delivery("node@a", task_id)


# -- the completion task ------------------------------------------------------------------------------
def test_the_completion_runs_the_hook_once_and_ends_the_job(services: SimpleNamespace) -> None:
    finished_job(services)
    runtime = Runtime(services)

    finish_job(runtime, "job-1", delivery())

    state = services.store.state("job-1")
    assert state.status is JobStatus.SUCCEEDED and state.message == ""
    assert len(runtime.predictor.completed) == 1
    assert runtime.predictor.completed[0]["batch_metrics"]["succeeded"] == 2
    assert services.placement.released == ["job-1"]
    assert services.nodes.inflight("node@a") == {}  # off the node once done


def test_a_copy_of_the_completion_arriving_after_it_ran_changes_nothing(services: SimpleNamespace) -> None:
    finished_job(services)
    runtime = Runtime(services)
    finish_job(runtime, "job-1", delivery("task-1"))

    finish_job(runtime, "job-1", delivery("task-2"))  # beat's copy, or the one a lost reply made

    assert len(runtime.predictor.completed) == 1
    assert services.store.state("job-1").status is JobStatus.SUCCEEDED


def test_a_copy_arriving_while_another_runs_the_hook_leaves_it_to_that_one(services: SimpleNamespace) -> None:
    finished_job(services)
    assert services.store.claim_completion("job-1", "task-1/first", "task-1").value == "claimed"
    runtime = Runtime(services)

    finish_job(runtime, "job-1", delivery("task-2"))

    assert runtime.predictor.completed == []
    assert services.store.state("job-1").status is JobStatus.RUNNING


def test_a_redelivery_after_its_node_died_before_the_hook_was_done_fails_the_job_without_running_it_again(
    services: SimpleNamespace,
) -> None:
    finished_job(services)
    services.store.claim_completion("job-1", "task-1/previous-life", "task-1")  # then the node was killed
    runtime = Runtime(services)

    finish_job(runtime, "job-1", delivery("task-1"))  # the same message, given back by the node's next life

    state = services.store.state("job-1")
    assert state.status is JobStatus.WORKER_ERROR and state.message == DIED_MESSAGE
    assert runtime.predictor.completed == []


def test_once_the_hook_ran_any_copy_settles_the_jobs_status_with_what_the_hook_did(services: SimpleNamespace) -> None:
    finished_job(services)
    store = services.store
    store.claim_completion("job-1", "task-1/died-after-the-hook", "task-1")
    store.mark_hook_done("job-1", "on_job_complete raised: ValueError: no")
    runtime = Runtime(services)

    finish_job(runtime, "job-1", delivery("task-1"))

    state = store.state("job-1")
    assert state.status is JobStatus.COMPLETED_WITH_FAILURES
    assert state.message == "on_job_complete raised: ValueError: no"
    assert runtime.predictor.completed == []


def test_a_hook_that_raises_completes_the_job_with_failures(services: SimpleNamespace) -> None:
    finished_job(services)
    runtime = Runtime(services, Predictor(raises=True))

    finish_job(runtime, "job-1", delivery())

    state = services.store.state("job-1")
    assert state.status is JobStatus.COMPLETED_WITH_FAILURES
    assert state.message.startswith("on_job_complete raised:") and "the summary could not be written" in state.message


def test_a_predictor_that_cannot_be_built_fails_the_job(services: SimpleNamespace) -> None:
    finished_job(services)

    finish_job(Runtime(services, build_error="the model file is corrupt"), "job-1", delivery())

    state = services.store.state("job-1")
    assert state.status is JobStatus.WORKER_ERROR and state.message == "the model file is corrupt"


def test_a_completion_of_a_job_that_is_gone_does_nothing(services: SimpleNamespace) -> None:
    runtime = Runtime(services)

    finish_job(runtime, "never-was", delivery())

    assert runtime.predictor.completed == [] and services.placement.released == []


class FlakyStore:
    """The job store with Redis away for the first `failures` calls of each listed method."""

    def __init__(self, store: JobStore, failures: int, methods: tuple[str, ...]) -> None:
        self._store = store
        self._left = {name: failures for name in methods}

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._store, name)
        if name not in self._left:
            return method

        def flaky(*args: Any, **kwargs: Any) -> Any:
            if self._left[name] > 0:
                self._left[name] -= 1
                raise redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
            return method(*args, **kwargs)

        return flaky


@pytest.mark.parametrize("method", ["state", "claim_completion", "mark_hook_done", "transition"])
def test_a_redis_error_at_any_step_is_waited_out_not_taken_for_a_vanished_job(
    services: SimpleNamespace, method: str
) -> None:
    finished_job(services)
    services.store = FlakyStore(services.store, failures=3, methods=(method,))
    runtime = Runtime(services)
    pauses: list[float] = []

    finish_job(runtime, "job-1", delivery(), sleep=pauses.append)

    assert services.store.state("job-1").status is JobStatus.SUCCEEDED
    assert len(runtime.predictor.completed) == 1  # repeats of the run never run the hook again
    assert len(pauses) == 3 and pauses == sorted(pauses)


# -- beat sends the completion again ---------------------------------------------------------------------
def sent(services: SimpleNamespace) -> list[tuple[str, tuple[Any, ...], str]]:
    return services.celery.sent


def test_a_job_left_unended_after_its_batches_were_recorded_gets_its_completion_again(
    services: SimpleNamespace,
) -> None:
    finished_job(services)  # its completion task was lost: the recorder never heard that it completed the job

    assert resend_completions(services, now=T0 + GRACE_S - 0.001, grace_s=GRACE_S) == []
    assert resend_completions(services, now=T0 + GRACE_S, grace_s=GRACE_S) == ["job-1"]

    assert sent(services) == [(FINISH_JOB, ("job-1",), "job.job-1")]


def test_the_completion_is_sent_again_once_per_grace_period(services: SimpleNamespace) -> None:
    finished_job(services)

    assert resend_completions(services, now=T0 + GRACE_S, grace_s=GRACE_S) == ["job-1"]
    assert resend_completions(services, now=T0 + GRACE_S + 1, grace_s=GRACE_S) == []
    assert resend_completions(services, now=T0 + 2 * GRACE_S, grace_s=GRACE_S) == ["job-1"]

    assert len(sent(services)) == 2


def test_jobs_with_batches_left_ended_or_being_completed_are_left_alone(services: SimpleNamespace) -> None:
    store = services.store
    unfinished = Job(job_id="unfinished", api_name="iris", workers=1, config={}, timeout=None,
                     total_batch_count=2, start_time=T0)
    store.create(unfinished, JobStatus.RUNNING)
    store.record_success("unfinished", 0, 0.1)
    store.seal("unfinished", 2, now=T0)
    finished_job(services, "ended")
    store.transition("ended", JobStatus.SUCCEEDED, now=T0)
    finished_job(services, "completing")
    store.claim_completion("completing", "task-1/a", "task-1")  # its hook is running now

    assert resend_completions(services, now=T0 + 3600, grace_s=GRACE_S) == []
    assert sent(services) == []


def test_a_job_whose_hook_ran_but_whose_status_was_not_settled_gets_its_completion_again(
    services: SimpleNamespace,
) -> None:
    finished_job(services)
    services.store.claim_completion("job-1", "task-1/a", "task-1")
    services.store.mark_hook_done("job-1")  # then its node died before the job's status was written

    assert resend_completions(services, now=T0 + GRACE_S, grace_s=GRACE_S) == ["job-1"]

    runtime = Runtime(services)
    finish_job(runtime, "job-1", delivery("task-2"))
    assert services.store.state("job-1").status is JobStatus.SUCCEEDED
    assert runtime.predictor.completed == []


def test_the_grace_period_is_two_beat_intervals_at_least() -> None:
    assert completion_grace_s(Settings(beat_interval_s=1)) == COMPLETION_GRACE_S
    assert completion_grace_s(Settings(beat_interval_s=30)) == 60
