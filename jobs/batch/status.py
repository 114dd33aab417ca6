"""The public `job_status` document, derived from a job's stored state."""

from __future__ import annotations

from typing import Any

from jobs.batch.job import JobStatus, iso_time
from jobs.store import JobState


def worker_counts(state: JobState) -> dict[str, int]:
    """Predictor instances of the job by phase, in Cortex's vocabulary."""
    assigned = len(state.nodes)
    running = assigned if state.status is JobStatus.RUNNING else 0
    pending = max(state.job.workers - assigned, 0) if not state.status.is_terminal else 0
    # A job whose batches failed still had its workers run to the end: they succeeded.
    finished = state.status in (JobStatus.SUCCEEDED, JobStatus.COMPLETED_WITH_FAILURES)
    return {
        "pending": pending,
        "running": running,
        "succeeded": assigned if finished else 0,
        "failed": assigned if state.status in (JobStatus.WORKER_ERROR, JobStatus.WORKER_OOM) else 0,
    }


def task_status_view(state: JobState) -> dict[str, Any]:
    """A TaskAPI job's status, as Cortex's: its spec, status, times, worker counts (and why it failed)."""
    view = state.job.spec()
    view.update(
        {
            "status": state.status.value,
            "start_time": iso_time(state.job.start_time),
            "end_time": iso_time(state.end_time) if state.end_time else None,
            "worker_counts": worker_counts(state),
        }
    )
    if state.message:
        view["message"] = state.message
    return view


def job_phase(state: JobState, workers_note: str | None = None) -> str | None:
    """What an active job is doing, in words, until its first batch ends (then its counts say it):
    enqueuing, waiting for nodes (and why), building the predictor, running."""
    if state.status is JobStatus.ENQUEUING:
        return "enqueuing batches"
    if state.status is not JobStatus.RUNNING:
        return None
    if state.succeeded or state.failed:
        return "running"
    if state.predictor_note:
        return state.predictor_note
    if workers_note:
        return f"waiting for worker nodes: {workers_note}"
    return "waiting for a worker node to take the first batch"


def job_status_view(state: JobState, workers_note: str | None = None) -> dict[str, Any]:
    """A job's `job_status`; `workers_note`: why an active job runs on fewer nodes than its `workers`
    (beat's plan, `jobs/placement/node_plan.py`), shown only while it is active."""
    if state.job.is_task:
        return task_status_view(state)
    view = state.job.spec()
    average = state.average_time_per_batch
    view.update(
        {
            "status": state.status.value,
            "batches_in_queue": state.batches_in_queue,
            "batch_metrics": {
                "succeeded": state.succeeded,
                "failed": state.failed,
                "average_time_per_batch": round(average, 6) if average is not None else None,
            },
            "worker_counts": worker_counts(state),
            "end_time": iso_time(state.end_time) if state.end_time else None,
        }
    )
    if state.message:
        view["message"] = state.message
    if workers_note and not state.status.is_terminal:
        view["workers_note"] = workers_note
    phase = job_phase(state, workers_note)
    if phase is not None:
        view["phase"] = phase
    return view
