"""Thin Celery task wrappers over the worker runtime (`jobs/runner.py`): the only tasks worker nodes run.

No task stores a result (`ignore_result`): batches report to the job store, which also decides
when a job is complete (see `jobs/batch/publish.py`). Periodic maintenance is no task: it runs in beat's
own process (`beat/scheduler.py`), so a node whose predictor hangs cannot hold it up.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from celery import Celery, Task
from celery.exceptions import Reject

from foundation.redis_clients import TRANSIENT_ERRORS
from jobs.transport.broker import receipt_for
from jobs.transport.delivery import Delivery

RUN_BATCH = "sluice.run_batch"
FINISH_JOB = "sluice.finish_job"
RUN_ASYNC = "sluice.run_async"
RUN_ASYNC_QUEUED = "sluice.run_async_queued"
# How a node runs a batch's message (`jobs/transport/batch_strategy.py`); named, so that only a
# worker imports it (Celery does, as it starts consuming).
BATCH_STRATEGY = "jobs.transport.batch_strategy:batch_strategy"


class BatchWorker(Protocol):
    """What the tasks run (`jobs.runner.WorkerRuntime`)."""

    def run_batch(self, job_id: str, index: int, payload: Any, payload_ref: dict[str, Any] | None = None,
                  delivery: Delivery | None = None) -> None: ...

    def finish_job(self, job_id: str, delivery: Delivery | None = None) -> None: ...

    def run_request(self, api_name: str, request_id: str, delivery: Delivery | None = None) -> None: ...

    def run_queued_requests(self, api_name: str, delivery: Delivery | None = None) -> None: ...


def register_tasks(app: Celery, runtime_factory: Callable[[], BatchWorker]) -> None:
    """Register Sluice's tasks on `app`; `runtime_factory()` gives this process's `WorkerRuntime`.

    Not shared with other apps (`shared=False`): a process that makes two apps (the API's, a test's)
    must not have one app's tasks reach the other's runtime."""

    def run_batch(
        task: Task, job_id: str, index: int, payload: Any, payload_ref: dict[str, Any] | None = None
    ) -> None:
        request = task.request
        receipt = receipt_for(request.id)
        delivery = Delivery(request.hostname, request.id, receipt) if request.hostname and request.id else None
        try:
            runtime_factory().run_batch(job_id, index, payload, payload_ref, delivery)
        except TRANSIENT_ERRORS as e:  # Redis away past its retry window: not the batch's failure, and
            # Celery acknowledges (loses) a failed task's message; back to its queue instead, or, if
            # Redis is still away, settled by this node when it reconnects (jobs/transport/settle.py).
            raise Reject(f"Redis failed while the batch ran: {e}", requeue=True) from e

    def finish_job(task: Task, job_id: str) -> None:
        request = task.request
        delivery = Delivery(request.hostname, request.id) if request.hostname and request.id else None
        runtime_factory().finish_job(job_id, delivery)

    def run_async(task: Task, api_name: str, request_id: str) -> None:
        request = task.request
        delivery = Delivery(request.hostname, request.id) if request.hostname and request.id else None
        try:
            runtime_factory().run_request(api_name, request_id, delivery)
        except TRANSIENT_ERRORS as e:  # as for a batch: back to its queue, or settled when Redis is back
            raise Reject(f"Redis failed while the async request ran: {e}", requeue=True) from e

    def run_async_queued(task: Task, api_name: str) -> None:
        request = task.request
        delivery = Delivery(request.hostname, request.id) if request.hostname and request.id else None
        try:
            runtime_factory().run_queued_requests(api_name, delivery)
        except TRANSIENT_ERRORS as e:
            raise Reject(f"Redis failed while the async requests ran: {e}", requeue=True) from e

    # Registered by call, not as decorators: Celery's are untyped, and would make these functions so.
    app.task(name=RUN_BATCH, ignore_result=True, acks_late=True, bind=True, shared=False,
             Strategy=BATCH_STRATEGY)(run_batch)
    app.task(name=FINISH_JOB, ignore_result=True, acks_late=True, bind=True, shared=False)(finish_job)
    app.task(name=RUN_ASYNC, ignore_result=True, acks_late=True, bind=True, shared=False)(run_async)
    app.task(name=RUN_ASYNC_QUEUED, ignore_result=True, acks_late=True, bind=True, shared=False)(run_async_queued)
