"""Single steps of the periodic loops; each takes `now`, so tests drive them with fixed times."""

from __future__ import annotations

import logging
from typing import Iterator

from jobs.job import JobStatus
from jobs.services import Services
from jobs.store import JobState, JobStore

log = logging.getLogger(__name__)


def _active_jobs(store: JobStore) -> Iterator[JobState]:
    for job_id in store.active_ids():
        try:
            yield store.state(job_id)
        except Exception:  # expired between listing and reading
            continue


def check_timeouts(services: Services, now: float) -> list[str]:
    """Move every active job past its `timeout` to `status_timed_out`; returns their ids."""
    timed_out: list[str] = []
    store = services.store
    for state in _active_jobs(store):
        job, job_id = state.job, state.job.job_id
        if job.timeout is None or now < job.start_time + job.timeout:
            continue
        if store.transition(job_id, JobStatus.TIMED_OUT, message=f"job exceeded its timeout of {job.timeout}s", now=now):
            log.warning("job %s timed out after %ss", job_id, job.timeout)
            services.placement.release(job)
            timed_out.append(job_id)
    return timed_out


def fail_stalled_enqueues(services: Services, now: float, stale_after_s: float) -> list[str]:
    """Fail every job still enqueueing whose enqueuer has been silent for `stale_after_s`.

    Batches are cut and published by a thread of the API process that took the submission; if
    that process dies (killed, redeployed), the job would stay `status_enqueuing` forever.
    """
    failed: list[str] = []
    store = services.store
    for state in _active_jobs(store):
        job_id = state.job.job_id
        if state.status is not JobStatus.ENQUEUING:
            continue
        seen = store.enqueue_seen(job_id)
        silent = now - (seen if seen is not None else state.job.start_time)
        if silent <= stale_after_s:
            continue
        message = (f"enqueueing stopped: the API process cutting this job's input made no progress "
                   f"for {silent:.0f}s (it died or was restarted); submit the job again")
        if store.transition(job_id, JobStatus.ENQUEUE_FAILED, allowed_from=[JobStatus.ENQUEUING], message=message, now=now):
            log.warning("job %s: %s", job_id, message)
            services.placement.release(state.job)
            failed.append(job_id)
    return failed
