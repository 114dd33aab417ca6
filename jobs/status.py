"""The public `job_status` document, derived from a job's stored state."""

from __future__ import annotations

from typing import Any

from .job import JobStatus, iso_time
from .store import JobState


def worker_counts(state: JobState) -> dict[str, int]:
    """Predictor instances of the job by phase, in Cortex's vocabulary."""
    assigned = len(state.nodes)
    running = assigned if state.status is JobStatus.RUNNING else 0
    pending = max(state.job.workers - assigned, 0) if not state.status.is_terminal else 0
    return {
        "pending": pending,
        "running": running,
        "succeeded": assigned if state.status is JobStatus.SUCCEEDED else 0,
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


def job_status_view(state: JobState, workers_note: str | None = None) -> dict[str, Any]:
    """A job's `job_status`; `workers_note`: why an active job runs on fewer nodes than its `workers`
    (beat's plan, `jobs/node_plan.py`), shown only while it is active."""
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
    return view
