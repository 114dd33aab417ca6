"""A job's completion: `on_job_complete` runs at most once however often the completion task comes, a
Redis error is waited out rather than taken for a vanished job, and beat sends the completion again
for a job whose batches are all recorded but which has not ended.

Fast: the job store and node registry are the in-memory ones (they pass the contract tests),
placement runs over them with the in-memory job queues, and the job's predictor is a small class here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis

from beat.completions import COMPLETION_GRACE_S, completion_grace_s, resend_completions
from foundation.errors import PredictorError
from foundation.settings import Settings
from jobs.batch.completion import DIED_MESSAGE, JobCompletion
from jobs.batch.job import Job, JobStatus
from jobs.batch.predictors import JobPredictor, JobPredictors
from jobs.nodes.memory import MemoryNodes
from jobs.placement.batch import Placement
from jobs.store import JobStorage
from jobs.store.memory import MemoryJobStore
from jobs.transport.delivery import Delivery
from jobs.transport.memory import MemoryJobQueues

T0 = 1_700_000_000.0
GRACE_S = 10.0


class Predictor:
    def __init__(self, raises: bool = False) -> None:
        self.completed: list[dict[str, Any]] = []
        self.raises = raises

    def on_job_complete(self, job_status: dict[str, Any] | None = None) -> None:
        assert job_status is not None
        self.completed.append(job_status)
        if self.raises:
            raise ValueError("the summary could not be written")

    def close(self) -> None:
        pass

    def predict(self, payload: Any, batch_id: str) -> Any:
        return payload


class Builder:
    """Stands in for building the job's predictor from its bundle."""

    def __init__(self, predictor: Predictor, build_error: str = "") -> None:
        self.predictor = predictor
        self.build_error = build_error

    def build(self, job: Job) -> JobPredictor:
        if self.build_error:
            raise PredictorError(self.build_error)
        return self.predictor

    def discard(self, job_id: str, job: Job | None) -> None:
        pass


@dataclass
class World:
    """A process's collaborators, in memory, and what they were asked."""

    store: MemoryJobStore = field(default_factory=MemoryJobStore)
    queues: MemoryJobQueues = field(default_factory=MemoryJobQueues)
    sent: list[tuple[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.nodes = MemoryNodes(30, inflight=self.store.inflight)
        self.placement = Placement(self.queues, self.store, self.nodes)

    def send_completion(self, job_id: str, queue: str) -> None:
        self.sent.append((job_id, queue))

    @property
    def released(self) -> list[str]:
        """Jobs whose queue was dropped: what `Placement.release` does last."""
        return [queue.removeprefix("job.") for queue in self.queues.dropped]


class Completing:
    """A process completing jobs (`JobCompletion`) with one predictor for every job."""

    def __init__(self, world: World, predictor: Predictor | None = None, build_error: str = "",
                 sleep: Callable[[float], Any] = lambda seconds: None, store: Any = None) -> None:
        """`store`: the job store as this process sees it (a flaky one, say); the world's by default."""
        self.predictor = predictor or Predictor()
        self.predictors = JobPredictors(world.store, Builder(self.predictor, build_error))
        self.completion = JobCompletion(store or world.store, world.nodes, world.placement, self.predictors, (),
                                        sleep=sleep)

    def finish(self, job_id: str, delivery: Delivery | None = None) -> None:
        self.completion.finish(job_id, delivery)


@pytest.fixture
def world() -> World:
    return World()


def finished_job(world: World, job_id: str = "job-1", recorded_at: float = T0, failed: int = 0) -> Job:
    """A running job whose two batches are recorded (the last of them at `recorded_at`)."""
    job = Job(job_id=job_id, api_name="iris", workers=1, config={}, timeout=None, total_batch_count=2,
              start_time=T0 - 60)
    store = world.store
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
def test_the_completion_runs_the_hook_once_and_ends_the_job(world: World) -> None:
    finished_job(world)
    runtime = Completing(world)

    runtime.finish("job-1", delivery())

    state = world.store.state("job-1")
    assert state.status is JobStatus.SUCCEEDED and state.message == ""
    assert len(runtime.predictor.completed) == 1
    assert runtime.predictor.completed[0]["batch_metrics"]["succeeded"] == 2
    assert world.released == ["job-1"]
    assert world.nodes.inflight("node@a") == {}  # off the node once done


def test_a_copy_of_the_completion_arriving_after_it_ran_changes_nothing(world: World) -> None:
    finished_job(world)
    runtime = Completing(world)
    runtime.finish("job-1", delivery("task-1"))

    runtime.finish("job-1", delivery("task-2"))  # beat's copy, or the one a lost reply made

    assert len(runtime.predictor.completed) == 1
    assert world.store.state("job-1").status is JobStatus.SUCCEEDED


def test_a_copy_arriving_while_another_runs_the_hook_leaves_it_to_that_one(world: World) -> None:
    finished_job(world)
    assert world.store.claim_completion("job-1", "task-1/first", "task-1").value == "claimed"
    runtime = Completing(world)

    runtime.finish("job-1", delivery("task-2"))

    assert runtime.predictor.completed == []
    assert world.store.state("job-1").status is JobStatus.RUNNING


def test_a_redelivery_after_its_node_died_before_the_hook_was_done_fails_the_job_without_running_it_again(
    world: World,
) -> None:
    finished_job(world)
    world.store.claim_completion("job-1", "task-1/previous-life", "task-1")  # then the node was killed
    runtime = Completing(world)

    runtime.finish("job-1", delivery("task-1"))  # the same message, given back by the node's next life

    state = world.store.state("job-1")
    assert state.status is JobStatus.WORKER_ERROR and state.message == DIED_MESSAGE
    assert runtime.predictor.completed == []


def test_once_the_hook_ran_any_copy_settles_the_jobs_status_with_what_the_hook_did(world: World) -> None:
    finished_job(world)
    store = world.store
    store.claim_completion("job-1", "task-1/died-after-the-hook", "task-1")
    store.mark_hook_done("job-1", "on_job_complete raised: ValueError: no")
    runtime = Completing(world)

    runtime.finish("job-1", delivery("task-1"))

    state = store.state("job-1")
    assert state.status is JobStatus.COMPLETED_WITH_FAILURES
    assert state.message == "on_job_complete raised: ValueError: no"
    assert runtime.predictor.completed == []


def test_a_hook_that_raises_completes_the_job_with_failures(world: World) -> None:
    finished_job(world)
    runtime = Completing(world, Predictor(raises=True))

    runtime.finish("job-1", delivery())

    state = world.store.state("job-1")
    assert state.status is JobStatus.COMPLETED_WITH_FAILURES
    assert state.message.startswith("on_job_complete raised:") and "the summary could not be written" in state.message


def test_a_predictor_that_cannot_be_built_fails_the_job(world: World) -> None:
    finished_job(world)

    Completing(world, build_error="the model file is corrupt").finish("job-1", delivery())

    state = world.store.state("job-1")
    assert state.status is JobStatus.WORKER_ERROR and state.message == "the model file is corrupt"


def test_a_completion_of_a_job_that_is_gone_does_nothing(world: World) -> None:
    runtime = Completing(world)

    runtime.finish("never-was", delivery())

    assert runtime.predictor.completed == [] and world.released == []


class FlakyStore:
    """The job store with Redis away for the first `failures` calls of each listed method."""

    def __init__(self, store: JobStorage, failures: int, methods: tuple[str, ...]) -> None:
        self._store = store
        self._left = dict.fromkeys(methods, failures)

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
    world: World, method: str
) -> None:
    finished_job(world)
    pauses: list[float] = []
    runtime = Completing(world, sleep=pauses.append, store=FlakyStore(world.store, failures=3, methods=(method,)))

    runtime.finish("job-1", delivery())

    assert world.store.state("job-1").status is JobStatus.SUCCEEDED
    assert len(runtime.predictor.completed) == 1  # repeats of the run never run the hook again
    assert len(pauses) == 3 and pauses == sorted(pauses)


# -- beat sends the completion again ---------------------------------------------------------------------
def resend(world: World, now: float) -> list[str]:
    """Beat's step, with the grace period of these tests."""
    return resend_completions(world.store, world.store, world.send_completion, now, grace_s=GRACE_S)


def test_a_job_left_unended_after_its_batches_were_recorded_gets_its_completion_again(
    world: World,
) -> None:
    finished_job(world)  # its completion task was lost: the recorder never heard that it completed the job

    assert resend(world, now=T0 + GRACE_S - 0.001) == []
    assert resend(world, now=T0 + GRACE_S) == ["job-1"]

    assert world.sent == [("job-1", "job.job-1")]


def test_the_completion_is_sent_again_once_per_grace_period(world: World) -> None:
    finished_job(world)

    assert resend(world, now=T0 + GRACE_S) == ["job-1"]
    assert resend(world, now=T0 + GRACE_S + 1) == []
    assert resend(world, now=T0 + 2 * GRACE_S) == ["job-1"]

    assert len(world.sent) == 2


def test_jobs_with_batches_left_ended_or_being_completed_are_left_alone(world: World) -> None:
    store = world.store
    unfinished = Job(job_id="unfinished", api_name="iris", workers=1, config={}, timeout=None,
                     total_batch_count=2, start_time=T0)
    store.create(unfinished, JobStatus.RUNNING)
    store.record_success("unfinished", 0, 0.1)
    store.seal("unfinished", 2, now=T0)
    finished_job(world, "ended")
    store.transition("ended", JobStatus.SUCCEEDED, now=T0)
    finished_job(world, "completing")
    store.claim_completion("completing", "task-1/a", "task-1")  # its hook is running now

    assert resend(world, now=T0 + 3600) == []
    assert world.sent == []


def test_a_job_whose_hook_ran_but_whose_status_was_not_settled_gets_its_completion_again(
    world: World,
) -> None:
    finished_job(world)
    world.store.claim_completion("job-1", "task-1/a", "task-1")
    world.store.mark_hook_done("job-1")  # then its node died before the job's status was written

    assert resend(world, now=T0 + GRACE_S) == ["job-1"]

    runtime = Completing(world)
    runtime.finish("job-1", delivery("task-2"))
    assert world.store.state("job-1").status is JobStatus.SUCCEEDED
    assert runtime.predictor.completed == []


def test_the_grace_period_is_two_beat_intervals_at_least() -> None:
    assert completion_grace_s(Settings(beat_interval_s=1)) == COMPLETION_GRACE_S
    assert completion_grace_s(Settings(beat_interval_s=30)) == 60
