"""The Celery app of Sluice, configured for safe batch work.

- `worker_pool = "solo"`: a node is one process that runs its batches itself; scale with more
  nodes (`-n`). Against prefork with one child it saves the hand-over of every task between
  parent and child (the gap between two batches fell from 2.6 to 1.8 ms in
  `bench/onnx_batch.py`), sets CUDA up in the process that uses it, and is Cortex's
  one-process worker.
- `task_acks_late`: a node killed mid-batch (or ended by its batch time limit,
  `jobs/batch/time_limit.py`) leaves the message unacknowledged; the node's in-flight hash lets beat
  (or the node's next life) give it back at once.
  `task_reject_on_worker_lost` covers anyone who runs a node with `--pool prefork` anyway.
  (Giving back is `jobs/transport/settle.py`'s.)
- `worker_prefetch_multiplier` (`SLUICE_WORKER_PREFETCH`, default 1): a node holds one batch at a
  time, so nothing waits behind a slow batch on a busy node (2 measured slower).
- `visibility_timeout` is the longest batch allowed before Redis re-delivers it.
- `queue_order_strategy = "round_robin"` (kombu's default, pinned): a node consumes its hardware
  queue (AsyncAPI requests) and the queues of the jobs placed on it (batches) in turn, each
  queue moved to the back of the BRPOP once it gave a message, so on a single node neither a long
  job nor a burst of requests starves the other (tests/integration/test_async_api.py).
- `polling_interval` bounds kombu's BRPOP: a node told to consume a new job queue (see
  `jobs/placement/batch.py`) only starts on it when its current wait ends (1 s by kombu's default,
  half a second of every job's start on average).
- The transport is kombu's Redis one with a reused client (`jobs/transport/broker.py`), or its Sentinel
  one when `SLUICE_REDIS_SENTINELS` is set (the broker then follows a failover as the store
  does); its sockets time out and are kept alive (`jobs.transport.broker.transport_options`).
- `beat_scheduler`: `celery -A jobs beat` runs Sluice's maintenance steps (timeouts, placement)
  in its own process (`beat/scheduler.py`); no periodic task goes to the nodes, whose predictors
  may hang. Named, not imported: only beat's process loads it.

The tasks and the node's hooks take this process's services and runtime from `jobs/wiring.py`,
built once, on first use.
"""

from __future__ import annotations

from functools import partial

from celery import Celery

from foundation.settings import Settings

MAINTENANCE_SCHEDULER = "beat.scheduler:MaintenanceScheduler"


def create_celery(settings: Settings) -> Celery:
    """A configured app with Sluice's tasks, beat scheduler and worker-node hooks registered."""
    from jobs.nodes.worker_node import install_worker_hooks
    from jobs.tasks import register_tasks
    from jobs.transport.broker import broker_ssl, broker_url, transport_for, transport_options
    from jobs.wiring import init_services, worker_runtime

    # No result backend: tasks report to the job store, which also does the fan-in (jobs/batch/publish.py).
    broker = broker_url(settings.redis_address)
    app = Celery("sluice", broker=broker, set_as_current=False)
    app.conf.update(
        broker_transport=transport_for(broker),
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=settings.prefetch_multiplier,
        worker_pool="solo",
        worker_concurrency=1,
        task_default_queue="cpu",
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        broker_transport_options=transport_options(settings),
        broker_use_ssl=broker_ssl(settings.redis_address),
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        # Flower and `celery events` see tasks only with events on (SLUICE_TASK_EVENTS=1): a
        # message per task sent, started and ended, so off unless someone watches.
        worker_send_task_events=settings.task_events,
        task_send_sent_event=settings.task_events,
        beat_scheduler=MAINTENANCE_SCHEDULER,
    )

    register_tasks(app, partial(worker_runtime, app, settings))  # one runtime per process, made on first task
    install_worker_hooks(app, settings, partial(init_services, app, settings))
    return app
