"""The public `job_status` a user reads while their job runs and after it ends."""

from __future__ import annotations

import json
import re

import pytest

from jobs.batch.job import Job, JobStatus
from jobs.batch.status import job_status_view
from jobs.store import JobStorage
from jobs.store.memory import MemoryJobStore

T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z
RFC3339_UTC = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z$")


def make_job(workers: int = 3, total_batch_count: int = 4, timeout: int | None = 600) -> Job:
    return Job(
        job_id="0018bcfe5680a1b2c3d4",
        api_name="iris",
        workers=workers,
        config={"threshold": 0.5},
        timeout=timeout,
        total_batch_count=total_batch_count,
        start_time=T0,
        api_spec={"name": "iris", "predictor": {"path": "predictor.py"}},
        bundle="sha256-abc",
    )


@pytest.fixture
def store() -> JobStorage:
    return MemoryJobStore()  # it keeps the job store's contract (tests/contracts/job_store.py)


@pytest.fixture
def job(store: JobStorage) -> Job:
    job = make_job()
    store.create(job, JobStatus.RUNNING)
    return job


def view_of(store: JobStorage, job: Job) -> dict:
    return job_status_view(store.state(job.job_id))


def test_a_just_submitted_job_shows_its_spec_and_every_batch_in_queue(store: JobStorage) -> None:
    job = make_job()
    store.create(job, JobStatus.ENQUEUING)

    assert view_of(store, job) == {
        "job_id": "0018bcfe5680a1b2c3d4",
        "api_name": "iris",
        "kind": "BatchAPI",
        "workers": 3,
        "config": {"threshold": 0.5},
        "timeout": 600,
        "total_batch_count": 4,
        "start_time": "2023-11-14T22:13:20Z",
        "status": "status_enqueuing",
        "batches_in_queue": 4,
        "batch_metrics": {"succeeded": 0, "failed": 0, "average_time_per_batch": None},
        "worker_counts": {"pending": 3, "running": 0, "succeeded": 0, "failed": 0},
        "end_time": None,
        "phase": "enqueuing batches",
    }


def test_the_view_leaves_out_how_the_job_runs(store: JobStorage, job: Job) -> None:
    view = view_of(store, job)

    assert not {"api_spec", "bundle", "hardware_queue", "tries", "nodes", "message"} & view.keys()


def test_a_running_job_reports_its_progress_and_average_time_per_batch(store: JobStorage, job: Job) -> None:
    store.set_nodes(job.job_id, ["celery@a", "celery@b"])
    store.record_success(job.job_id, 0, 0.5)
    store.record_success(job.job_id, 1, 1.5)
    store.record_failure(job.job_id, 2, 1.0, "ValueError: bad row", 1, [[1, 2]])

    view = view_of(store, job)

    assert view["status"] == "status_running"
    assert view["batches_in_queue"] == 1
    assert view["batch_metrics"] == {"succeeded": 2, "failed": 1, "average_time_per_batch": 1.0}
    assert view["worker_counts"] == {"pending": 1, "running": 2, "succeeded": 0, "failed": 0}
    assert view["end_time"] is None


def test_the_average_time_per_batch_is_rounded_to_microseconds(store: JobStorage, job: Job) -> None:
    for index in range(3):
        store.record_success(job.job_id, index, 1.0)
    store.record_success(job.job_id, 3, 1.0 / 3)  # 3.333.../4

    assert view_of(store, job)["batch_metrics"]["average_time_per_batch"] == 0.833333


def test_a_succeeded_job_has_an_rfc3339_utc_end_time_and_no_batches_in_queue(store: JobStorage, job: Job) -> None:
    store.set_nodes(job.job_id, ["celery@a", "celery@b", "celery@c"])
    for index in range(4):
        store.record_success(job.job_id, index, 2.0)
    store.transition(job.job_id, JobStatus.SUCCEEDED, now=T0 + 90)

    view = view_of(store, job)

    assert view["status"] == "status_succeeded"
    assert view["end_time"] == "2023-11-14T22:14:50Z"
    assert RFC3339_UTC.match(view["end_time"])
    assert view["batches_in_queue"] == 0
    assert view["worker_counts"] == {"pending": 0, "running": 0, "succeeded": 3, "failed": 0}
    assert "message" not in view


def test_an_end_time_with_a_fraction_of_a_second_keeps_it_and_ends_in_z(store: JobStorage, job: Job) -> None:
    store.transition(job.job_id, JobStatus.SUCCEEDED, now=T0 + 0.25)

    end_time = view_of(store, job)["end_time"]

    assert end_time == "2023-11-14T22:13:20.250000Z"
    assert RFC3339_UTC.match(end_time)


def test_a_stopped_job_tells_the_user_why_it_ended(store: JobStorage, job: Job) -> None:
    store.record_success(job.job_id, 0, 1.0)
    store.transition(job.job_id, JobStatus.STOPPED, message="stopped by request", now=T0 + 5)

    view = view_of(store, job)

    assert view["status"] == "status_stopped"
    assert view["message"] == "stopped by request"
    assert view["batches_in_queue"] == 0
    assert view["batch_metrics"]["succeeded"] == 1
    assert view["end_time"] == "2023-11-14T22:13:25Z"


@pytest.mark.parametrize("status", [JobStatus.WORKER_ERROR, JobStatus.WORKER_OOM])
def test_a_job_whose_workers_failed_counts_them_as_failed(store: JobStorage, job: Job, status: JobStatus) -> None:
    store.set_nodes(job.job_id, ["celery@a", "celery@b"])
    store.transition(job.job_id, status, message="Handler.__init__ raised: ...", now=T0 + 1)

    view = view_of(store, job)

    assert view["worker_counts"] == {"pending": 0, "running": 0, "succeeded": 0, "failed": 2}
    assert view["message"] == "Handler.__init__ raised: ..."


def test_a_job_whose_batches_failed_counts_its_workers_as_succeeded(store: JobStorage, job: Job) -> None:
    store.set_nodes(job.job_id, ["celery@a", "celery@b"])
    store.transition(job.job_id, JobStatus.COMPLETED_WITH_FAILURES, now=T0 + 1)

    assert view_of(store, job)["worker_counts"] == {"pending": 0, "running": 0, "succeeded": 2, "failed": 0}


def test_the_phase_says_what_a_job_does_until_its_first_batch_ends(store: JobStorage, job: Job) -> None:
    def phase() -> str | None:
        return job_status_view(store.state(job.job_id), workers_note="1 of 3 nodes starting").get("phase")

    assert phase() == "waiting for worker nodes: 1 of 3 nodes starting"
    store.note_predictor(job.job_id, "building the predictor on celery@a")
    assert phase() == "building the predictor on celery@a"
    store.record_success(job.job_id, 0, 0.5)
    assert phase() == "running"
    store.transition(job.job_id, JobStatus.STOPPED, now=T0 + 1)
    assert phase() is None


def test_a_job_waiting_for_workers_shows_them_as_pending(store: JobStorage, job: Job) -> None:
    assert view_of(store, job)["worker_counts"] == {"pending": 3, "running": 0, "succeeded": 0, "failed": 0}


def test_a_job_without_timeout_reports_none(store: JobStorage) -> None:
    job = make_job(timeout=None)
    store.create(job)

    assert view_of(store, job)["timeout"] is None


def test_the_view_is_plain_json(store: JobStorage, job: Job) -> None:
    store.record_failure(job.job_id, 0, 1.0, "boom", 1, [1])
    store.transition(job.job_id, JobStatus.COMPLETED_WITH_FAILURES, message="1 batch failed", now=T0 + 3)

    view = view_of(store, job)

    assert json.loads(json.dumps(view)) == view


def test_every_status_is_either_active_or_terminal_and_the_client_agrees() -> None:
    from jobs.batch.job import ACTIVE_STATUSES, TERMINAL_STATUSES
    from sluice.client import ACTIVE_STATUSES as CLIENT_ACTIVE
    from sluice.client import TERMINAL_STATUSES as CLIENT_TERMINAL

    assert set(ACTIVE_STATUSES) | TERMINAL_STATUSES == set(JobStatus)
    assert not set(ACTIVE_STATUSES) & TERMINAL_STATUSES
    assert all(status.is_terminal for status in TERMINAL_STATUSES)
    assert {status.value for status in TERMINAL_STATUSES} == CLIENT_TERMINAL
    assert {"status_enqueuing", "status_running"} == CLIENT_ACTIVE
