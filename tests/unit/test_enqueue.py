"""Submitting a job: its record, its placement and the batch tasks it publishes.

Fast: the job store is the in-memory one (it passes the store's contract tests), the broker is
kombu's in-memory transport, and placement runs over the in-memory fakes, remembering what it was
asked. Background enqueueing is waited for by joining its thread, never by sleeping.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from foundation.errors import BadRequest, Conflict, JobNotFound
from foundation.settings import Settings
from jobs.batch.enqueue import plan_job, stop_job, submit_job
from jobs.batch.job import Job, JobStatus
from jobs.batch.submission import parse_job_request
from jobs.nodes.memory import MemoryNodes
from jobs.placement.batch import Placement
from jobs.services import Services
from jobs.store.memory import MemoryJobStore
from jobs.tasks import FINISH_JOB, RUN_BATCH
from jobs.transport.memory import MemoryJobQueues
from predictors_runtime.bundles import BundleStore

T0 = 1_700_000_000.0
API_SPEC = {"name": "iris", "kind": "BatchAPI", "predictor": {"type": "python", "path": "predictor.py"}}


class RecordingPlacement(Placement):
    """Placement over the in-memory fakes that remembers what it was asked; `on_assign` lets a test act
    at the moment a job is placed (a user stopping it, say)."""

    def __init__(self, store: MemoryJobStore) -> None:
        self.queues = MemoryJobQueues()
        super().__init__(self.queues, store, MemoryNodes(15.0, inflight=store.inflight))
        self.assigned: list[str] = []
        self.released: list[str] = []
        self.on_assign: Callable[[Job], object] | None = None

    def assign(self, job: Job, now: float) -> list[str]:
        self.assigned.append(job.job_id)
        if self.on_assign is not None:
            self.on_assign(job)
        return super().assign(job, now)

    def release(self, job: Job, nodes: list[str] | None = None) -> None:
        self.released.append(job.job_id)
        super().release(job, nodes)

    @property
    def dropped(self) -> list[str]:
        return self.queues.dropped


@pytest.fixture
def store() -> MemoryJobStore:
    return MemoryJobStore()


@pytest.fixture
def placement(store: MemoryJobStore) -> RecordingPlacement:
    return RecordingPlacement(store)


@pytest.fixture
def services(tmp_path: Path, store: MemoryJobStore, placement: RecordingPlacement) -> Services:
    celery = Celery("sluice-test", broker="memory://", set_as_current=False)
    celery.conf.update(task_serializer="json", accept_content=["json"])
    return Services(
        settings=Settings(local_input_roots=(str(tmp_path),)), celery=celery, redis=redis.Redis(),  # never used
        store=store, nodes=placement.nodes, placement=placement, queues=placement.queues,
        bundles=BundleStore(str(tmp_path / "storage"), tmp_path / "cache"),
    )


def submit(services: Services, body: dict[str, Any], background: bool = False) -> Job:
    plan = plan_job(services, parse_job_request(body), "iris")
    return submit_job(services, plan, "iris", API_SPEC, "sha256-abc", "cpu", now=T0, background=background)


def published(services: Services, queue: str) -> list[tuple[str, list[Any]]]:
    """(task name, args) of every message waiting on `queue`, in order."""
    out = []
    with services.celery.connection_for_read() as conn:
        queue_ = conn.SimpleQueue(queue)
        try:
            while len(queue_):
                message = queue_.get(timeout=1)
                out.append((message.headers["task"], message.payload[0]))
                message.ack()
        finally:
            queue_.close()
    return out


def enqueued(job: Job) -> None:
    """Wait for the job's background enqueuer to finish."""
    for thread in threading.enumerate():
        if thread.name == f"enqueue-{job.job_id}":
            thread.join()


def test_an_item_list_is_cut_into_batches_published_on_the_jobs_own_queue_and_the_job_runs(
    services: Services, placement: RecordingPlacement
) -> None:
    job = submit(services, {"item_list": {"items": [1, 2, 3, 4, 5], "batch_size": 2}, "workers": 2})

    assert published(services, job.queue) == [
        (RUN_BATCH, [job.job_id, 0, [1, 2], None]),
        (RUN_BATCH, [job.job_id, 1, [3, 4], None]),
        (RUN_BATCH, [job.job_id, 2, [5], None]),
    ]
    state = services.store.state(job.job_id)
    assert (state.status, state.job.total_batch_count, state.sealed_total) == (JobStatus.RUNNING, 3, 3)
    assert placement.assigned == [job.job_id]
    # Each batch's payload is kept until it is recorded, so beat can publish a lost one again.
    assert services.store.kept_payloads(job.job_id, [0, 2]) == {0: ([1, 2], None), 2: ([5], None)}


def test_enqueueing_in_the_background_answers_at_once_with_the_job_enqueuing(services: Services) -> None:
    job = submit(services, {"item_list": {"items": list(range(10)), "batch_size": 5}}, background=True)

    assert job.spec()["total_batch_count"] == 2
    enqueued(job)
    assert services.store.status(job.job_id) is JobStatus.RUNNING
    assert len(published(services, job.queue)) == 2


def test_a_job_stopped_as_soon_as_it_was_placed_never_starts_and_its_queue_is_dropped(
    services: Services, placement: RecordingPlacement
) -> None:
    placement.on_assign = lambda job: stop_job(services, job)

    job = submit(services, {"item_list": {"items": [1, 2, 3], "batch_size": 1}})

    state = services.store.state(job.job_id)
    assert (state.status, state.message) == (JobStatus.STOPPED, "stopped by request")
    assert job.queue in placement.dropped
    assert placement.released == [job.job_id]


def test_a_json_lines_file_with_a_bad_line_fails_the_job_naming_the_line_and_nothing_of_it_runs(
    services: Services, tmp_path: Path, placement: RecordingPlacement
) -> None:
    (tmp_path / "input.jsonl").write_text('{"x": 1}\n{"x": 2\n{"x": 3}\n')

    job = submit(services, {"delimited_files": {"s3_paths": [str(tmp_path / "input.jsonl")], "batch_size": 1}})

    state = services.store.state(job.job_id)
    assert state.status is JobStatus.ENQUEUE_FAILED
    assert state.message.startswith("enqueueing failed: ") and "line 2: not valid JSON" in state.message
    assert "\n" not in state.message
    assert placement.assigned == []
    assert placement.released == [job.job_id]


def test_a_job_with_all_batches_recorded_before_its_seal_is_completed_by_the_enqueuer(
    services: Services, placement: RecordingPlacement
) -> None:
    def run_everything_at_once(job: Job) -> None:  # workers faster than the enqueuer's seal
        services.store.record_success(job.job_id, 0, 0.1)

    placement.on_assign = run_everything_at_once

    job = submit(services, {"item_list": {"items": [1], "batch_size": 1}})

    assert published(services, job.queue) == [(RUN_BATCH, [job.job_id, 0, [1], None]), (FINISH_JOB, [job.job_id])]


def test_retrying_a_jobs_failed_batches_publishes_only_those_with_the_old_jobs_config(services: Services) -> None:
    old = submit(services, {"item_list": {"items": [1, 2, 3], "batch_size": 1}, "config": {"threshold": 0.9}})
    with pytest.raises(Conflict, match="still status_running"):
        submit(services, {"retry_failed_of": old.job_id})
    services.store.record_success(old.job_id, 0, 0.1)
    services.store.record_failure(old.job_id, 1, 0.1, "ValueError: two", 2, [2])
    services.store.record_success(old.job_id, 2, 0.1)
    services.store.transition(old.job_id, JobStatus.COMPLETED_WITH_FAILURES)  # as its completion task settles it
    published(services, old.queue)  # the old job's messages, run by now

    retry = submit(services, {"retry_failed_of": old.job_id})

    assert (retry.retry_of, retry.config, retry.total_batch_count) == (old.job_id, {"threshold": 0.9}, 1)
    assert published(services, retry.queue) == [(RUN_BATCH, [retry.job_id, 0, [2], None])]


def test_a_retry_of_a_job_without_failures_or_of_an_unknown_job_is_refused_before_anything_exists(
    services: Services,
) -> None:
    done = submit(services, {"item_list": {"items": [1], "batch_size": 1}})
    services.store.record_success(done.job_id, 0, 0.1)
    services.store.transition(done.job_id, JobStatus.SUCCEEDED)

    with pytest.raises(BadRequest, match="has no failed batches"):
        submit(services, {"retry_failed_of": done.job_id})
    with pytest.raises(JobNotFound):
        submit(services, {"retry_failed_of": "0123456789abcdef0000"})
    assert services.store.list_ids("iris") == [done.job_id]
