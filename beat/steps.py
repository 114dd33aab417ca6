"""Single steps of the periodic loops; each takes `now`, so tests drive them with fixed times."""

from __future__ import annotations

import logging

from jobs.job import JobStatus
from jobs.services import Services

log = logging.getLogger(__name__)


def check_timeouts(services: Services, now: float) -> list[str]:
    """Move every active job past its `timeout` to `status_timed_out`; returns their ids."""
    timed_out: list[str] = []
    store = services.store
    for job_id in store.active_ids():
        try:
            job = store.get(job_id)
        except Exception:  # expired between listing and reading
            continue
        if job.timeout is None or now < job.start_time + job.timeout:
            continue
        if store.transition(job_id, JobStatus.TIMED_OUT, message=f"job exceeded its timeout of {job.timeout}s", now=now):
            log.warning("job %s timed out after %ss", job_id, job.timeout)
            services.placement.release(job)
            timed_out.append(job_id)
    return timed_out
