"""Thin Celery task wrappers over `jobs.runner`: the only tasks worker nodes run.

No task stores a result (`ignore_result`): batches report to the job store, which also decides
when a job is complete (see `jobs/publish.py`). Periodic maintenance is no task: it runs in beat's
own process (`beat/scheduler.py`), so a node whose predictor hangs cannot hold it up.
"""

from __future__ import annotations

from typing import Any

from celery import Celery, Task
from celery.exceptions import Reject

from foundation.redis_clients import TRANSIENT_ERRORS
from .nodes import Delivery

RUN_BATCH = "sluice.run_batch"
FINISH_JOB = "sluice.finish_job"


def register_tasks(app: Celery, runtime_factory: Any) -> None:
    """Register Sluice's tasks on `app`; `runtime_factory()` gives this process's `WorkerRuntime`."""

    @app.task(name=RUN_BATCH, ignore_result=True, acks_late=True, bind=True)
    def run_batch(
        task: Task, job_id: str, index: int, payload: Any, payload_ref: dict[str, Any] | None = None
    ) -> None:
        request = task.request
        delivery = Delivery(request.hostname, request.id) if request.hostname and request.id else None
        try:
            runtime_factory().run_batch(job_id, index, payload, payload_ref, delivery)
        except TRANSIENT_ERRORS as e:  # Redis away past its retry window: not the batch's failure, and
            # Celery acknowledges (loses) a failed task's message; back to its queue instead, or, if
            # Redis is still away, settled by this node when it reconnects (jobs/settle.py).
            raise Reject(f"Redis failed while the batch ran: {e}", requeue=True) from e

    @app.task(name=FINISH_JOB, ignore_result=True, acks_late=True, bind=True)
    def finish_job(task: Task, job_id: str) -> None:
        request = task.request
        delivery = Delivery(request.hostname, request.id) if request.hostname and request.id else None
        runtime_factory().finish_job(job_id, delivery)
