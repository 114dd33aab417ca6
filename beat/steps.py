"""Single steps of the periodic loops; each takes `now`, so tests drive them with fixed times, and
the collaborators it uses (the schedule hands them over from the process's services).

A step judges the active jobs one by one: a record that cannot be judged (unreadable, or holding
a value that breaks the arithmetic) is logged and skipped, so one bad job never switches a step
off for all the others. Redis failing ends the step; the loop runs it again next time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from foundation.api_kinds import ApiKind
from foundation.api_registry import ApiRegistry
from foundation.errors import JobNotFound, SluiceError
from jobs.asyncapi.objects import RequestObjects
from jobs.asyncapi.store import AsyncRequestStore
from jobs.batch.job import BAD_RECORD_ERRORS, JobStatus
from jobs.placement.batch import JobPlacement
from jobs.store import JobRecords, JobState

log = logging.getLogger(__name__)


def judge_each(store: JobRecords, step: str, judge: Callable[[JobState], bool]) -> list[str]:
    """Run `judge` on every active job in turn; returns the ids of the jobs it acted on (it returned True)."""
    acted: list[str] = []
    for job_id in store.active_ids():
        try:
            if judge(store.state(job_id)):
                acted.append(job_id)
        except JobNotFound:  # ended and expired between listing and reading
            continue
        except BAD_RECORD_ERRORS:  # this job's record is bad: the others are still judged
            log.exception("%s: skipping job %s, whose record could not be judged", step, job_id)
    return acted


def check_timeouts(store: JobRecords, placement: JobPlacement, now: float) -> list[str]:
    """Move every active job past its `timeout` to `status_timed_out` and let its nodes go; returns their ids."""

    def judge(state: JobState) -> bool:
        job = state.job
        if job.timeout is None or now < job.start_time + job.timeout:
            return False
        message = f"job exceeded its timeout of {job.timeout}s"
        if not store.transition(job.job_id, JobStatus.TIMED_OUT, message=message, now=now):
            return False
        log.warning("job %s timed out after %ss", job.job_id, job.timeout)
        placement.release(job)
        return True

    return judge_each(store, "check_timeouts", judge)


def fail_stalled_enqueues(store: JobRecords, placement: JobPlacement, now: float, stale_after_s: float) -> list[str]:
    """Fail every job still enqueueing whose enqueuer has been silent for `stale_after_s`.

    Batches are cut and published by a thread of the API process that took the submission; if
    that process dies (killed, redeployed), the job would stay `status_enqueuing` forever.
    """

    def judge(state: JobState) -> bool:
        job_id = state.job.job_id
        if state.status is not JobStatus.ENQUEUING:
            return False
        seen = store.enqueue_seen(job_id)
        silent = now - (seen if seen is not None else state.job.start_time)
        if silent <= stale_after_s:
            return False
        message = (f"enqueueing stopped: the API process cutting this job's input made no progress "
                   f"for {silent:.0f}s (it died or was restarted); submit the job again")
        if not store.transition(job_id, JobStatus.ENQUEUE_FAILED, allowed_from=[JobStatus.ENQUEUING], message=message,
                                now=now):
            return False
        log.warning("job %s: %s", job_id, message)
        placement.release(state.job)
        return True

    return judge_each(store, "fail_stalled_enqueues", judge)


def sweep_async_requests(requests: AsyncRequestStore, objects: RequestObjects, now: float,
                         limit: int = 500) -> list[str]:
    """Remove the AsyncAPI requests whose retention has passed: what they left in storage, then their
    records; returns "<api>/<id>" of those removed. One whose storage cannot be cleaned now stays
    for the next step."""
    removed: list[str] = []
    for api_name, request_id in requests.expired(now, limit):
        try:
            objects.remove(api_name, request_id)
        except SluiceError as e:  # storage away for now: tried again next step
            log.warning("removing the stored objects of async request %s/%s failed: %s", api_name, request_id, e)
            continue
        requests.remove(api_name, request_id)
        removed.append(f"{api_name}/{request_id}")
    return removed


def wake_queued_requests(registry: ApiRegistry, requests: AsyncRequestStore,
                         wake: Callable[[str], object]) -> list[str]:
    """Send a task for each AsyncAPI whose queued requests (`server_side_batching`) have none on its
    way: the process that queued them died before sending it, or it waited in its queue past the
    wake key's expiry (then two tasks share the work, which claiming keeps apart). Returns the APIs."""
    woken = []
    for api in registry.all():
        if api.kind == ApiKind.ASYNC and requests.rearm(api.name):
            log.info("async api %s has queued requests and no task on its way for them: one is sent", api.name)
            wake(api.name)
            woken.append(api.name)
    return woken
