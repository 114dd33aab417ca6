"""Turning a validated submission into a job: its record, its placement and its chord.

The API process keeps only task ids, never `AsyncResult`s, and waits on nothing: the batch
tasks and the chord body write the job's progress to Redis themselves.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from celery import chord

from predictors_runtime.loader import error_text

from .job import Job, JobStatus, new_job_id
from .services import Services
from .submission import JobRequest, split_items
from .tasks import FINISH_JOB, RUN_BATCH

log = logging.getLogger(__name__)


def publish_chord(services: Services, job: Job, batches: list[list[Any]]) -> str:
    """Send one task per batch and the completion body, all on the job's own queue."""
    signature = services.celery.signature
    options = {"queue": job.queue, "ignore_result": True}
    header = [
        signature(RUN_BATCH, args=(job.job_id, index, batch), immutable=True, **options)
        for index, batch in enumerate(batches)
    ]
    body = signature(FINISH_JOB, args=(job.job_id,), immutable=True, **options)
    result = chord(header, app=services.celery)(body)
    return result.id


def _enqueue(services: Services, job: Job, batches: list[list[Any]]) -> None:
    try:
        publish_chord(services, job, batches)
    except Exception as e:
        log.exception("enqueueing job %s failed", job.job_id)
        services.store.transition(job.job_id, JobStatus.ENQUEUE_FAILED, message=f"enqueueing failed: {error_text(e)}")
        services.placement.release(job)
        return
    if not services.store.transition(job.job_id, JobStatus.RUNNING, allowed_from=[JobStatus.ENQUEUING]):
        # Stopped (or timed out) while enqueueing: what was published after the stop goes too.
        services.placement.drop_queue(job.queue)


def submit_job(
    services: Services,
    request: JobRequest,
    api_name: str,
    api_spec: dict[str, Any],
    bundle: str,
    hardware_queue: str,
    now: float | None = None,
    background: bool = True,
) -> Job:
    """Create the job and start enqueueing it; returns as soon as the record exists.

    With `background`, batches are published by a thread while the caller answers the user
    (status `status_enqueuing` until the last one is queued).
    """
    assert request.item_list is not None
    now = time.time() if now is None else now
    batches = split_items(request.item_list.items, request.item_list.batch_size)
    job = Job(
        job_id=new_job_id(now),
        api_name=api_name,
        workers=request.workers,
        config=request.config,
        timeout=request.timeout,
        total_batch_count=len(batches),
        start_time=now,
        api_spec=api_spec,
        bundle=bundle,
        hardware_queue=hardware_queue,
        tries=request.tries,
    )
    services.store.create(job, JobStatus.ENQUEUING)
    services.placement.assign(job, now)
    if background:
        threading.Thread(target=_enqueue, args=(services, job, batches), name=f"enqueue-{job.job_id}").start()
    else:
        _enqueue(services, job, batches)
    return job


def stop_job(services: Services, job: Job) -> bool:
    """Stop a job: no further batch runs and `on_job_complete` is never called.

    Returns False when the job had already ended.
    """
    moved = services.store.transition(job.job_id, JobStatus.STOPPED, message="stopped by request")
    if moved:
        services.placement.release(job)
    return moved
