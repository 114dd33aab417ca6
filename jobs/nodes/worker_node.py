"""Hooks that make a Celery worker a Sluice node: the heartbeat, consuming the queues of the jobs
placed on it as soon as it starts, and settling what the node held when its previous life died or
its connection to Redis broke (`jobs/transport/settle.py`). (Maintenance runs in beat's process, never on a
node: see beat/.)

Every hook takes the process's services from the one wiring point (`jobs/wiring.py`), through the
`services` function `jobs/celery_app.py` hands in.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
from celery import Celery, bootsteps, signals
from kombu.exceptions import KombuError

from foundation.json_logs import configure_json_logging, set_process_labels
from foundation.printed_lines import print_to_log
from foundation.redis_clients import heartbeat_client, stop_riding_out
from foundation.settings import Settings
from jobs.nodes.loop_answers import NODE_LOOP, LoopAnswers
from jobs.nodes.registry import NodeRegistry, Nodes
from jobs.nodes.stall_watch import StallWatch
from jobs.services import Services
from jobs.transport.broker import keep_visible
from jobs.transport.settle import settle_deliveries

log = logging.getLogger(__name__)

# How long a node that ended itself for taking nothing (`jobs/nodes/stall_watch.py`) waits for Celery's
# warm shutdown before it exits hard, and the status it exits with then.
STALL_EXIT_GRACE_S = 30.0
EXIT_STALLED = 75

ServicesOf = Callable[[], Services]
"""This process's services (`jobs.wiring.init_services` for the node's app)."""


class Heartbeat:
    """A daemon thread in the node's main process announcing it alive every few seconds."""

    def __init__(self, app: Celery, settings: Settings, node: str) -> None:
        self._app = app
        self._settings = settings
        self.node = node
        self._stop = threading.Event()
        self._visible_until = 0.0  # kept visible up to here by the last restart of the clock
        self.watch = StallWatch(settings.worker_stall_s)
        self._thread = threading.Thread(target=self._run, name="sluice-heartbeat", daemon=True)

    def _queues(self) -> list[str]:
        return list(self._app.amqp.queues.consume_from.keys())

    def beat_once(self, nodes: NodeRegistry, client: redis.Redis) -> None:
        """Announce the node alive and keep the messages of the batches it runs from being re-delivered."""
        now = time.time()
        nodes.heartbeat(self.node, self._queues(), now)
        # A quarter of the visibility timeout between restarts (never less than a beat) leaves
        # three beats' worth of slack; each restart reads kombu's whole unacked hash.
        if now >= self._visible_until - 0.75 * self._settings.visibility_timeout_s:
            keep_visible(client, list(nodes.inflight(self.node)), now)
            self._visible_until = now + self._settings.visibility_timeout_s

    def stalled(self, client: redis.Redis) -> bool:
        """Whether the node has taken nothing for `SLUICE_WORKER_STALL_S` while its queues held
        messages (`jobs/nodes/stall_watch.py`); one look, one round trip."""
        from celery.worker import state as worker_state

        busy = bool(worker_state.active_requests or worker_state.reserved_requests)
        if busy:
            return self.watch.stalled(busy=True, waiting=0)
        pipe = client.pipeline(transaction=False)
        for queue in self._queues():
            pipe.llen(queue)
        try:
            waiting = sum(pipe.execute())
        except redis.RedisError:
            self.watch.restart()
            return False
        return self.watch.stalled(busy=False, waiting=waiting)

    def _end_stalled_node(self) -> None:
        """Warm shutdown (SIGTERM to this process), or a hard exit if that hangs: the supervisor
        starts the node again, on a fresh connection."""
        log.error("node %s has taken nothing for %g s while its queues hold messages; ending it "
                  "so that it is started again", self.node, self._settings.worker_stall_s)
        os.kill(os.getpid(), signal.SIGTERM)
        if not self._stop.wait(STALL_EXIT_GRACE_S):
            os._exit(EXIT_STALLED)

    def _run(self) -> None:
        # A client of its own, without retries: a beat that cannot be written is skipped, the next one is due soon.
        client = heartbeat_client(self._settings)
        nodes = Nodes(client, self._settings.node_ttl_s)
        failing = False
        while not self._stop.is_set():
            try:
                self.beat_once(nodes, client)
                if failing:
                    log.info("heartbeat of %s written again", self.node)
                failing = False
            except redis.RedisError as e:  # Redis stalls or restarts: said once, not every beat
                if not failing:
                    log.warning("heartbeat of %s failed: %s: %s", self.node, type(e).__name__, e)
                failing = True
            if self.stalled(client):
                self._end_stalled_node()
            self._stop.wait(self._settings.heartbeat_interval_s)
        with contextlib.suppress(redis.RedisError):
            nodes.forget(self.node)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def settle_node(services: Services, node: str) -> int:
    """Settle what `node` holds in flight and is not running (`jobs/transport/settle.py`); returns how many
    deliveries were settled (acknowledged as recorded, or given back)."""
    from celery.worker import state as worker_state

    running = {request.id for request in worker_state.active_requests}
    try:
        settled = settle_deliveries(node, services.nodes, services.store, services.store, services.queues, running)
    except (redis.RedisError, KombuError, OSError):  # Redis or the broker away again: beat gives them
        # back too, once this node's heartbeat has been silent long enough
        log.exception("settling the deliveries %s held failed", node)
        return 0
    return len(settled.acknowledged) + settled.given_back


class SettleOnConnect(bootsteps.StartStopStep):  # type: ignore[misc]  # Celery's bootsteps are untyped
    """A consumer step: each time the node's consumer (re)connects to Redis, before it takes any
    message, settle what the node held when its connection broke (or its last process died)."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, parent: Any, services: ServicesOf | None = None, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self._services = services

    def start(self, parent: Any) -> None:
        if self._services is None:
            return
        settled = settle_node(self._services(), parent.hostname)
        if settled:
            log.warning("node %s settled %d delivery(ies) it held before (re)connecting", parent.hostname, settled)


class AnswersOnLoop(bootsteps.StartStopStep):  # type: ignore[misc]  # Celery's bootsteps are untyped
    """A consumer step: while the consumer runs, its event loop uses the answers of batch records
    (`jobs/nodes/loop_answers.py`); when it stops (a reconnect, the node's shutdown), pending ones
    are used at once."""

    def __init__(self, parent: Any, answers: LoopAnswers = NODE_LOOP, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self._answers = answers

    def start(self, parent: Any) -> None:
        if parent.hub is not None:
            self._answers.attach(parent.hub)

    def stop(self, parent: Any) -> None:
        self._answers.detach()

    def shutdown(self, parent: Any) -> None:
        self._answers.detach()


def resume_assigned_queues(app: Celery, services: Services, node: str) -> list[str]:
    """A node starting (or restarting under the same name) consumes its jobs' and AsyncAPIs' queues
    from the start.

    The `add_consumer` commands sent while it was down (restarting after its watchdog ended a hung
    batch, say) reached nobody; beat's reconcile would send them again, but only up to a beat
    interval later. Returns the queues added.
    """
    try:
        queues = services.placement.assigned_queues(node) + services.async_placement.assigned_queues(node)
    except redis.RedisError as e:  # beat's reconcile sends them again
        log.warning("reading the jobs placed on %s failed: %s", node, e)
        return []
    for queue in queues:
        app.amqp.queues.select_add(queue, exchange=queue, exchange_type="direct", routing_key=queue)
    if queues:
        log.info("node %s resumes the jobs placed on it: %s", node, queues)
    return queues


def install_worker_hooks(app: Celery, settings: Settings, services: ServicesOf) -> None:
    """Connect the signal handlers and the consumer step; they act only inside a worker of this app."""
    state: dict[str, Heartbeat] = {}

    class _SettleOnConnect(SettleOnConnect):
        def __init__(self, parent: Any, **kwargs: Any) -> None:
            super().__init__(parent, services=services, **kwargs)

    app.steps["consumer"].add(_SettleOnConnect)
    app.steps["consumer"].add(AnswersOnLoop)

    def _json_lines(loglevel: int | str | None = None, **_: object) -> None:
        # Connected, this replaces Celery's own log set-up (worker and beat): JSON lines on stderr.
        configure_json_logging(loglevel or logging.INFO)
        print_to_log()  # a predictor's print() is a line of its job's log, as on Cortex

    def _consume_assigned_queues(sender: str, instance: Any, **_: object) -> None:
        if instance.app is app:
            set_process_labels(node=sender)  # every line of this node says which node (and host) wrote it
            resume_assigned_queues(app, services(), sender)

    def _start_heartbeat(sender: Any, **_: object) -> None:
        if sender.app is not app:
            return
        heartbeat = state["heartbeat"] = Heartbeat(app, settings, sender.hostname)
        heartbeat.start()
        log.info("sluice node %s serving %s", sender.hostname, heartbeat._queues())

    def _took_a_message(sender: Any = None, **_: object) -> None:
        heartbeat = state.get("heartbeat")
        if heartbeat is not None:
            heartbeat.watch.restart()

    def _stopping(**_: object) -> None:
        # Sent from the warm-shutdown signal handler: a batch waiting for a Redis that is away stops waiting.
        stop_riding_out()

    def _stop_heartbeat(sender: Any, **_: object) -> None:
        heartbeat = state.pop("heartbeat", None)
        if heartbeat is not None:
            heartbeat.stop()

    # Connected by call, not as decorators: Celery's signals are untyped, and would make these functions so.
    signals.setup_logging.connect(_json_lines, weak=False)
    signals.celeryd_after_setup.connect(_consume_assigned_queues, weak=False)
    signals.worker_ready.connect(_start_heartbeat, weak=False)
    signals.task_received.connect(_took_a_message, weak=False)
    signals.worker_shutting_down.connect(_stopping, weak=False)
    signals.worker_shutdown.connect(_stop_heartbeat, weak=False)
