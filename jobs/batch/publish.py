"""Sending a job's tasks: one per batch and one completion task, all on the job's own queue.

Sluice does its own fan-in instead of a Celery chord: a chord needs its whole header before
anything is sent, while `delimited_files` input is cut and published as it is read (memory
stays flat however large the input). The job store counts every batch exactly once; the
recording that completes a sealed job (or the seal itself, when the batches were faster) is
told so exactly once, and sends the completion task. No `chord_unlock` polling, no task result
stored for any batch. Should that one send be lost (a reply lost to a Redis stall, a node dying
before it sends), beat sends the completion again (`beat/completions.py`), and the job store lets
one copy run `on_job_complete` (`jobs/batch/completion.py`).

The broker itself can lose a batch's message (a node killed between kombu's BRPOP and its record
of the message as unacknowledged), so the publisher also keeps what each batch carries in the job
store until the batch is recorded, and beat publishes a lost batch again (`beat/lost_batches.py`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from functools import partial
from typing import TYPE_CHECKING, Any

import redis
from celery import Celery

from jobs.tasks import FINISH_JOB, RUN_BATCH
from jobs.transport.task_messages import QueuedMessage, TaskMessages

if TYPE_CHECKING:
    from jobs.store import BatchLedger

log = logging.getLogger(__name__)

SendCompletion = Callable[[str, str], None]
"""Sends a job's completion task: `(job id, the job's queue)`."""

PIPELINE = 500
# How long a push of messages rides out a Redis that refuses connections (restarting) before the
# enqueue fails; a Redis that stalls is waited for by the socket's own timeout.
PUSH_RETRY_S = 30.0


class BatchPublisher(AbstractContextManager["BatchPublisher"]):
    """Publishes batch tasks through one producer, keeping no per-task state.

    Given the job's batch `ledger`, each batch's payload is kept there (`BatchLedger.keep_payloads`), written
    PIPELINE at a time and before the messages carrying them are pushed.

    Each message is made from the job queue's template (`jobs/transport/task_messages.py`): what
    Celery would send, without Celery's routing, headers and encodings per task (about 0.15 ms of
    the API's CPU per batch, on the path before a `delimited_files` job's workers start), and
    pushed PIPELINE at a time in one round trip. Where no template can be made (another
    transport), the tasks go through Celery as before.
    """

    def __init__(self, celery: Celery, job_id: str, queue: str, store: BatchLedger | None = None,
                 messages: TaskMessages | None = None) -> None:
        self._celery = celery
        self._job_id = job_id
        self._queue = queue
        self._store = store
        self._messages = messages if messages is not None else TaskMessages(celery)
        self._unkept: dict[int, tuple[Any, dict[str, Any] | None]] = {}
        self._unpushed: list[QueuedMessage] = []
        self.published = 0

    def __enter__(self) -> BatchPublisher:
        self._stack = ExitStack()
        self._producer = self._stack.enter_context(self._celery.producer_or_acquire())
        # Declared once here: Celery would otherwise copy, bind and look the queue up per task.
        self._producer.maybe_declare(self._celery.amqp.queues[self._queue], retry=True)
        # kombu pipelines the Redis commands of a batch: one round trip per PIPELINE messages.
        self._stack.enter_context(self._producer.batch(max_size=PIPELINE))
        return self

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is None:
            self._keep()
            self._push()
        self._stack.__exit__(*exc)

    def _keep(self) -> None:
        if self._store is not None and self._unkept:
            self._store.keep_payloads(self._job_id, self._unkept)
        self._unkept = {}

    def _push(self) -> None:
        """The messages made so far onto their queue, in one round trip (their payloads kept first)."""
        if not self._unpushed:
            return
        messages, self._unpushed = self._unpushed, []
        deadline = time.monotonic() + PUSH_RETRY_S
        while True:
            try:
                with self._producer.channel.conn_or_acquire() as client:
                    pipe = client.pipeline(transaction=True)
                    for message in messages:
                        pipe.lpush(message.key, message.payload)
                    pipe.execute()
                return
            except redis.ConnectionError as e:  # refused or reset before the push: not queued, try again
                if time.monotonic() >= deadline:
                    raise
                log.warning("pushing %d batch message(s) of job %s failed (%s); trying again",
                            len(messages), self._job_id, e)
                time.sleep(0.5)

    def batch(self, index: int, payload: Any, payload_ref: dict[str, Any] | None) -> None:
        if self._store is not None:
            self._unkept[index] = (payload, payload_ref)
        message = self._messages.message(RUN_BATCH, (self._job_id, index, payload, payload_ref), self._queue,
                                          argsrepr="")
        if message is not None:
            self._unpushed.append(message)
            if len(self._unpushed) >= PIPELINE:
                self._keep()
                self._push()
            self.published += 1
            return
        if self._store is not None and len(self._unkept) >= PIPELINE:
            self._keep()
        self._celery.send_task(
            RUN_BATCH, args=(self._job_id, index, payload, payload_ref), queue=self._queue,
            producer=self._producer, ignore_result=True, add_to_parent=False, declare=[],
            # Celery would otherwise render the payload for monitoring, a large share of the cost.
            argsrepr="", kwargsrepr="",
        )
        self.published += 1


def send_completion(celery: Celery, job_id: str, queue: str) -> None:
    """Send the task that runs `on_job_complete` and settles the job's final status."""
    celery.send_task(FINISH_JOB, args=(job_id,), queue=queue, ignore_result=True, add_to_parent=False)


def completion_sender(celery: Celery) -> SendCompletion:
    """`send_completion` through this app, for what sends completions without knowing Celery."""
    return partial(send_completion, celery)
