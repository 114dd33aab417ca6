"""How a node runs a batch's Celery message: the Celery strategy of `sluice.run_batch`.

Celery hands every message of a task to the task's strategy (`Task.Strategy`, its documented hook).
The default one builds a `Request`, passes it to the pool, whose tracer pushes the task's context,
calls the task and settles the message through the request. On a node (the solo pool, one message
at a time, acknowledged late) a batch runs inline in the consumer either way, and most of that
machinery is for what a batch does not use: results, events, ETAs, rate limits, pool hand-overs.
On `bench/onnx_batch.py` (iris, batches of 256, 2 cores) it was about a tenth of a node's CPU per
batch: the two nodes spent 0.50-0.57 CPU-s each per 200,000 rows with it, 0.45-0.50 without.

This strategy runs a batch message the same way with less: the message's body decoded, the batch
noted in Celery's worker state as reserved and then running (what the node's stall watch reads
from its heartbeat thread while the batch runs, and its settling), `task_received` sent, the task called with its
id and node name in its request context, and the message then acknowledged, or rejected when the
task raises `Reject`, through the callbacks the consumer handed in (as Celery's `Request` does). A
task that raises anything else is logged and acknowledged, as Celery does with a late-acknowledged
task that fails (a batch records its own failures; what escapes is not the batch's). Any message
that needs more goes to Celery's default strategy: one with an ETA or an expiry, a revoked one, one
whose body is not Celery's protocol 2 (args, kwargs, embed) or that links other work (callbacks,
errbacks, a chain or a chord), and every message while task events are on (`SLUICE_TASK_EVENTS`:
Flower and `celery events` read the request's events). Only `task_received` of Celery's task signals
is sent for a batch run here (the node's stall watch listens to it); `task_prerun`, `task_postrun`,
`task_success` and `task_failure` come from the tracer, which a batch's message no longer passes:
instrumentation that needs them runs the nodes with `SLUICE_TASK_EVENTS=1`.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from celery import signals
from celery.exceptions import Reject
from celery.worker import state as worker_state
from celery.worker.strategy import default

from foundation import figure_sink as process_figures
from foundation.figures import UNREADABLE_MESSAGES

log = logging.getLogger(__name__)


class HandedBack(BaseException):
    """Raised into a batch by a cold shutdown (SIGQUIT, a second Ctrl-C): the batch stops unrecorded
    and its message unacknowledged, so it is handed back. A BaseException, so that no step counts it
    as the predictor's failure."""


@dataclass(eq=False)  # kept in Celery's sets of requests by identity
class RunningBatch:
    """What Celery's worker state keeps of a batch run by this strategy: its task id and name, and
    what its control commands read of a request (`info`; they are answered between batches), and
    what a cold shutdown calls (`task`, `cancel`)."""

    id: str
    name: str
    hostname: str
    delivery_info: dict[str, Any]
    args: Any
    task: Any = None
    time_start: float = field(default_factory=time.time)
    acknowledged: bool = False

    def cancel(self, pool: Any = None, emit_retry: bool = True) -> None:
        """Celery's cold shutdown cancelling the batch, from its signal handler on the thread that runs
        it: the node is to end (Celery sets this after cancelling, which the raise skips), and the
        batch stops here, unrecorded."""
        worker_state.should_terminate = True
        raise HandedBack(f"batch {self.id} handed back: the node is shutting down cold")

    def info(self, safe: bool = False) -> dict[str, Any]:
        return {
            "id": self.id, "name": self.name, "args": self.args, "kwargs": {}, "type": self.name,
            "hostname": self.hostname, "time_start": self.time_start, "acknowledged": self.acknowledged,
            "delivery_info": self.delivery_info, "worker_pid": os.getpid(),
        }


Handler = Callable[..., Any]


def _plain_call(body: Any) -> bool:
    """Whether a decoded body is protocol 2's `[args, kwargs, embed]` with nothing to run after the task
    (no callbacks, errbacks, chain or chord, which Celery's tracer runs)."""
    if not (isinstance(body, (list, tuple)) and len(body) == 3 and isinstance(body[0], (list, tuple))
            and isinstance(body[1], dict) and isinstance(body[2], dict)):
        return False
    return not any(body[2].get(key) for key in ("callbacks", "errbacks", "chain", "chord"))


def _guarded(task: Any, consumer: Any, celery_strategy: Handler) -> Handler:
    """Celery's own strategy, with a message it cannot read rejected rather than ending the node.

    Celery's `Request` raises on a body neither protocol reads (a JSON object from a writer other
    than Sluice, say); uncaught, that ends the node, the message is restored, and the restarted node
    takes it again: a poison message. Rejected without requeue instead (beat republishes the batch
    from its kept copy, as for a message of the wrong content type) and counted in
    `sluice_unreadable_messages_total`.
    """
    connection_errors = consumer.connection_errors

    def handle(message: Any, body: Any, ack: Any, reject: Any, callbacks: Any, **kwargs: Any) -> Any:
        try:
            return celery_strategy(message, body, ack, reject, callbacks, **kwargs)
        except Exception as e:  # noqa: BLE001 - whatever Celery could not read, the node goes on
            task_id = (message.headers or {}).get("id", "?")
            log.error("a %s message (%s) that neither Sluice nor Celery can read was rejected without requeue: "
                      "%s: %s", task.name, task_id, type(e).__name__, e)
            process_figures.count(UNREADABLE_MESSAGES.name, (task.name,))
            reject(log, connection_errors, False)
            return None

    return handle


def batch_strategy(task: Any, app: Any, consumer: Any, **options: Any) -> Handler:
    """The message handler of `task` on this node's consumer (called by Celery as it starts consuming)."""
    celery_default: Handler = _guarded(task, consumer, default(task, app, consumer, **options))
    if app.conf.worker_send_task_events:
        return celery_default
    hostname = consumer.hostname
    connection_errors = consumer.connection_errors
    revoked = consumer.controller.state.revoked

    def plain_call(message: Any, headers: dict[str, Any], callbacks: Any) -> Any:
        """The message's decoded body if this strategy runs it, else None (Celery's does)."""
        task_id = headers.get("id")
        if callbacks or not task_id or headers.get("eta") or headers.get("expires") or task_id in revoked:
            return None
        try:
            decoded = message.decode()
        except Exception:  # noqa: BLE001 - not decodable or not accepted: Celery's strategy says why
            return None
        return decoded if _plain_call(decoded) else None

    def handle(message: Any, body: Any, ack: Any, reject: Any, callbacks: Any, **kwargs: Any) -> Any:
        headers = message.headers or {}
        decoded = plain_call(message, headers, callbacks)
        if decoded is None:
            return celery_default(message, body, ack, reject, callbacks, **kwargs)
        args, task_kwargs, _ = decoded
        task_id = headers["id"]
        running = RunningBatch(task_id, task.name, hostname, message.delivery_info, args, task)
        signals.task_received.send(sender=consumer, request=running)
        worker_state.task_reserved(running)
        worker_state.task_accepted(running)
        task.push_request(id=task_id, hostname=hostname, delivery_info=message.delivery_info, headers=headers)
        successful = False
        try:
            task.run(*args, **task_kwargs)
            successful = True
        except Reject as e:
            log.warning("task %s[%s] rejected (requeue: %s): %s", task.name, task_id, e.requeue, e.reason)
            running.acknowledged = True
            reject(log, connection_errors, e.requeue)
            return None
        except HandedBack as e:  # unacknowledged: the broker's visibility, or the next node's settling, gives it back
            log.warning("%s", e)
            return None
        except Exception:  # as Celery's tracer: logged, and the late acknowledgement still made
            log.exception("task %s[%s] raised", task.name, task_id)
        finally:
            task.pop_request()
            worker_state.task_ready(running, successful=successful)
        running.acknowledged = True
        ack(log, connection_errors)
        return None

    return handle
