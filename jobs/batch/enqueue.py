"""Turning a validated submission into a job: its plan, its record, its placement and its tasks.

What can be refused is checked before the job exists (`plan_job`: sources, files, paths, the job
to retry), so a bad submission creates nothing. Cutting input into batches and publishing them
then runs in the background while the job is `status_enqueuing`. The API process keeps no
`AsyncResult` and waits on nothing: the batch tasks and the completion task write the job's
progress to Redis themselves.

Enqueueing stays a thread of the API process that took the submission, not a Celery task: no
process consumes a queue a task could go to without taking a predictor's node (worker nodes are
one solo process each, prefetching one message, placed per job), a task redelivered after a crash
would publish the job's batches a second time, and the user's input (an item list) would have to
travel through Redis once more. The thread's liveness is watched instead: it touches its job
every `ENQUEUE_TOUCH_S`, and beat fails a job whose enqueuer went silent (`beat/steps.py`).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import redis
from kombu.exceptions import OperationalError

from foundation.errors import BadRequest, Conflict, SluiceError
from foundation.redis_clients import one_line
from jobs.batch.inputs import check_local_path, cut_ranges, is_local, match_files
from jobs.batch.job import Job, JobStatus, new_job_id
from jobs.batch.line_checks import LINE_CHECKS
from jobs.batch.publish import BatchPublisher, send_completion
from jobs.batch.submission import JobRequest, split_items
from jobs.batch.time_limit import batch_time_limit
from jobs.services import Services
from predictors_runtime.storage import ObjectInfo, split_uri

log = logging.getLogger(__name__)

Batch = tuple[Any, "dict[str, Any] | None"]  # (payload, or a reference to it in storage)

# How often the enqueuer shows it is alive; beat fails a job whose enqueuer is silent for
# `Settings.enqueue_stale_s` (its API process died mid-enqueue).
ENQUEUE_TOUCH_S = 1.0


@dataclass
class JobPlan:
    """A submission checked against the world: what it will read, write and inherit."""

    request: JobRequest
    files: list[ObjectInfo] = field(default_factory=list)
    retry_of: Job | None = None
    retry_batches: list[Batch] = field(default_factory=list)
    output: dict[str, Any] | None = None

    @property
    def total_batch_count(self) -> int | None:
        """Known before reading the input, except for JSON-lines files."""
        request = self.request
        if request.item_list is not None:
            return math.ceil(len(request.item_list.items) / request.item_list.batch_size)
        if request.file_path_lister is not None:
            return math.ceil(len(self.files) / request.file_path_lister.batch_size)
        if request.retry_failed_of is not None:
            return len(self.retry_batches)
        return None

    def dry_run_view(self) -> dict[str, Any]:
        return {
            "dry_run": True,
            "validation": "passed",
            "source": self.request.source,
            "files": [info.uri for info in self.files],
            "total_batch_count": self.total_batch_count,
        }


def _checked_output(request: JobRequest, roots: tuple[str, ...]) -> dict[str, Any] | None:
    if request.output is None:
        return None
    path = request.output.path
    if is_local(path):
        path = check_local_path(path, roots)
    else:
        split_uri(path)  # refuses a malformed URI
    return {"path": path, "format": request.output.format}


def plan_job(services: Services, request: JobRequest, api_name: str) -> JobPlan:
    """Everything about a submission that can fail before a job exists: 400/404/409 here."""
    roots = services.settings.local_input_roots
    plan = JobPlan(request=request, output=_checked_output(request, roots))
    if request.file_path_lister is not None:
        plan.files = match_files(request.file_path_lister, roots, "file_path_lister")
    elif request.delimited_files is not None:
        plan.files = match_files(request.delimited_files, roots, "delimited_files")
    elif request.retry_failed_of is not None:
        old = services.store.state(request.retry_failed_of, api_name=api_name)
        if not old.status.is_terminal:
            raise Conflict(f"job {old.job.job_id} is still {old.status.value}; retry its failed batches once it ends")
        failed = services.store.failed_batches(old.job.job_id)
        if not failed:
            raise BadRequest(f"job {old.job.job_id} has no failed batches to retry")
        plan.retry_of = old.job
        plan.retry_batches = [(f["payload"], f.get("payload_ref")) for f in failed]
        if plan.output is None:
            plan.output = old.job.output
    return plan


def _batches(plan: JobPlan) -> Iterator[Batch]:
    request = plan.request
    if request.item_list is not None:
        for items in split_items(request.item_list.items, request.item_list.batch_size):
            yield items, None
    elif request.file_path_lister is not None:
        for uris in split_items([info.uri for info in plan.files], request.file_path_lister.batch_size):
            yield uris, None
    elif request.delimited_files is not None:
        for ref in cut_ranges(plan.files, request.delimited_files.batch_size, LINE_CHECKS):
            yield None, ref.to_dict()
    else:
        yield from plan.retry_batches


def _enqueue(services: Services, job: Job, batches: Iterable[Batch]) -> None:
    """The enqueuer's whole work: whatever fails, the job ends `status_enqueue_failed` with a
    one-line message saying what happened, and nothing is left enqueueing for good.

    Redis stalling or restarting is ridden out, not a failure: the store's client repeats its
    calls for up to `Settings.redis_retry_s`, and kombu's publishing waits for a stalled Redis.
    """
    try:
        _publish_and_start(services, job, batches)
    except Exception as e:  # noqa: BLE001 - last-resort boundary, the thread's last word: any failure must end the job
        # (with a one-line message), never the thread alone
        _fail_enqueue(services, job, e)


def _publish_and_start(services: Services, job: Job, batches: Iterable[Batch]) -> None:
    """Publish batches as they are cut, then start the job and seal its batch count.

    Input read from files is validated while it is cut, so its job's workers are told to start
    only once all of it is queued: a malformed line then means nothing of the job has run.
    """
    store = services.store
    touched = time.monotonic()
    with BatchPublisher(services.celery, job.job_id, job.queue, store) as publisher:
        for index, (payload, ref) in enumerate(batches):
            if index % 1000 == 0 and store.status(job.job_id) is not JobStatus.ENQUEUING:
                break  # stopped or timed out while enqueueing
            if time.monotonic() - touched >= ENQUEUE_TOUCH_S:
                store.touch_enqueue(job.job_id, time.time())
                touched = time.monotonic()
            publisher.batch(index, payload, ref)
    total = publisher.published
    if job.total_batch_count != total:
        job = replace(job, total_batch_count=total)
        store.update_record(job)
    if not store.transition(job.job_id, JobStatus.RUNNING, allowed_from=[JobStatus.ENQUEUING]):
        # Stopped (or timed out) while enqueueing: what was published after the stop goes too.
        services.placement.drop_queue(job.queue)
        return
    if job.source == "delimited_files":
        services.placement.assign(job, time.time())
    if store.seal(job.job_id, total):
        try:
            send_completion(services.celery, job.job_id, job.queue)
        except (OperationalError, redis.RedisError) as e:  # the seal stands: beat sends the completion again
            log.warning("sending the completion of job %s failed (%s); beat sends it again", job.job_id, one_line(e))


def _fail_enqueue(services: Services, job: Job, error: Exception) -> None:
    message = f"enqueueing failed: {one_line(error)}"
    log.warning("job %s: %s", job.job_id, message, exc_info=not isinstance(error, SluiceError))
    try:
        if services.store.transition(job.job_id, JobStatus.ENQUEUE_FAILED, message=message):
            services.placement.release(job)
    except (OperationalError, redis.RedisError) as e:  # beat fails it once its enqueuer has been silent long enough
        log.error("job %s could not be marked as failed: %s", job.job_id, one_line(e))


def submit_job(
    services: Services,
    plan: JobPlan,
    api_name: str,
    api_spec: dict[str, Any],
    bundle: str,
    hardware_queue: str,
    now: float | None = None,
    background: bool = True,
    environment: dict[str, Any] | None = None,
    job_id: str | None = None,
) -> Job:
    """Create the job and start enqueueing it; returns as soon as the record exists.

    With `background`, batches are cut and published by a thread while the caller answers the
    user (status `status_enqueuing` until the last one is queued). `job_id`: the id to give it
    (one an idempotency key was claimed for); else a new one.
    """
    request = plan.request
    now = time.time() if now is None else now
    retry_of = plan.retry_of
    job = Job(
        job_id=job_id or new_job_id(now),
        api_name=api_name,
        workers=request.workers,
        config=request.config or (retry_of.config if retry_of else {}),
        timeout=request.timeout,
        total_batch_count=plan.total_batch_count or 0,
        start_time=now,
        api_spec=api_spec,
        bundle=bundle,
        hardware_queue=hardware_queue,
        tries=request.tries if request.sqs_dead_letter_queue or not retry_of else retry_of.tries,
        retry_of=retry_of.job_id if retry_of else None,
        source=request.source,
        output=plan.output,
        batch_timeout=batch_time_limit(request.batch_timeout, api_spec, services.settings),
        environment=environment,
    )
    start_job(services, job, _batches(plan), now, background)
    return job


def start_job(services: Services, job: Job, batches: Iterable[Batch], now: float, background: bool = True) -> None:
    """Store a new job's record, place it on nodes, and publish its `batches` (in a thread with `background`)."""
    services.store.create(job, JobStatus.ENQUEUING)
    if job.source != "delimited_files":  # those wait for their input to be validated (see _enqueue)
        services.placement.assign(job, now)
    if background:
        threading.Thread(target=_enqueue, args=(services, job, batches), name=f"enqueue-{job.job_id}").start()
    else:
        _enqueue(services, job, batches)


def stop_job(services: Services, job: Job) -> bool:
    """Stop a job: no further batch runs and `on_job_complete` is never called.

    Returns False when the job had already ended.
    """
    moved = services.store.transition(job.job_id, JobStatus.STOPPED, message="stopped by request")
    if moved:
        services.placement.release(job)
    return moved
