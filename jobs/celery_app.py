"""The Celery app of Sluice, configured for safe batch work.

- `task_acks_late` + `task_reject_on_worker_lost`: a worker process killed mid-batch gives the
  batch back to the queue instead of losing it.
- `worker_prefetch_multiplier` (`SLUICE_WORKER_PREFETCH`, default 1): a node holds one batch at a
  time, so nothing waits behind a slow batch on a busy node (2 measured no faster in
  `bench/onnx_batch.py`).
- `worker_concurrency = 1`: a node is one predictor process; scale with more nodes (`-n`).
- `visibility_timeout` is the longest batch allowed before Redis re-delivers it.
- `polling_interval` bounds kombu's BRPOP: a node told to consume a new job queue (see
  `jobs/placement.py`) only starts on it when its current wait ends (1 s by kombu's default,
  half a second of every job's start on average).
- The transport is kombu's Redis one with a reused client (`jobs/broker.py`).
"""

from __future__ import annotations

import threading

from celery import Celery

from .settings import Settings

_lock = threading.Lock()
_runtime = None


def create_celery(settings: Settings) -> Celery:
    """A configured app with Sluice's tasks, beat schedule and worker-node hooks registered."""
    from beat.schedule import beat_schedule

    from .broker import transport_for
    from .placement import MAINTENANCE_QUEUE
    from .tasks import register_tasks
    from .worker_node import install_worker_hooks

    # No result backend: tasks report to the job store, which also does the fan-in (jobs/publish.py).
    app = Celery("sluice", broker=settings.redis_url, set_as_current=False)
    transport = {
        "visibility_timeout": int(settings.visibility_timeout_s),
        "polling_interval": settings.broker_poll_interval_s,
    }
    app.conf.update(
        broker_transport=transport_for(settings.redis_url),
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=settings.prefetch_multiplier,
        worker_concurrency=1,
        task_default_queue="cpu",
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        broker_transport_options=transport,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
        task_routes={
            "sluice.check_timeouts": {"queue": MAINTENANCE_QUEUE},
            "sluice.reconcile_placement": {"queue": MAINTENANCE_QUEUE},
        },
        beat_schedule=beat_schedule(settings),
    )

    def runtime_factory():  # one runtime per process, made on first task
        global _runtime
        with _lock:
            if _runtime is None:
                from .runner import WorkerRuntime
                from .services import Services

                _runtime = WorkerRuntime(Services.connect(settings, app))
            return _runtime

    register_tasks(app, runtime_factory)
    install_worker_hooks(app, settings)
    return app
