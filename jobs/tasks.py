"""Thin Celery task wrappers over `jobs.runner` and `beat.steps`.

No task stores a result (`ignore_result`): batches report to the job store, which also decides
when a job is complete (see `jobs/publish.py`).
"""

from __future__ import annotations

import time
from typing import Any

from celery import Celery, Task

from .store import Delivery

RUN_BATCH = "sluice.run_batch"
FINISH_JOB = "sluice.finish_job"
CHECK_TIMEOUTS = "sluice.check_timeouts"
RECONCILE_PLACEMENT = "sluice.reconcile_placement"


def register_tasks(app: Celery, runtime_factory: Any) -> None:
    """Register Sluice's tasks on `app`; `runtime_factory()` gives this process's `WorkerRuntime`."""

    @app.task(name=RUN_BATCH, ignore_result=True, acks_late=True, bind=True)
    def run_batch(
        task: Task, job_id: str, index: int, payload: Any, payload_ref: dict[str, Any] | None = None
    ) -> None:
        request = task.request
        delivery = Delivery(request.hostname, request.id) if request.hostname and request.id else None
        runtime_factory().run_batch(job_id, index, payload, payload_ref, delivery)

    @app.task(name=FINISH_JOB, ignore_result=True, acks_late=True)
    def finish_job(job_id: str) -> None:
        runtime_factory().finish_job(job_id)

    @app.task(name=CHECK_TIMEOUTS, ignore_result=True)
    def check_timeouts() -> None:
        from beat.steps import check_timeouts as step, fail_stalled_enqueues

        services = runtime_factory().services
        now = time.time()
        step(services, now)
        fail_stalled_enqueues(services, now, services.settings.enqueue_stale_s)

    @app.task(name=RECONCILE_PLACEMENT, ignore_result=True)
    def reconcile_placement() -> None:
        runtime_factory().services.placement.reconcile(time.time())
