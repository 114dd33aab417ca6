"""Hooks that make a Celery worker a Sluice node: the heartbeat, and settling what the node held
when its previous life died or its connection to Redis broke (`jobs/settle.py`). (Maintenance
runs in beat's process, never on a node: see beat/.)"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

import redis
from celery import Celery, bootsteps, signals
from kombu.exceptions import KombuError

from foundation.json_logs import configure_json_logging

from foundation import keys
from .broker import keep_visible
from .nodes import write_heartbeat
from foundation.settings import Settings

if TYPE_CHECKING:
    from .services import Services

log = logging.getLogger(__name__)


class Heartbeat:
    """A daemon thread in the node's main process announcing it alive every few seconds."""

    def __init__(self, app: Celery, settings: Settings, node: str) -> None:
        self._app = app
        self._settings = settings
        self.node = node
        self._stop = threading.Event()
        self._visible_until = 0.0  # kept visible up to here by the last restart of the clock
        self._thread = threading.Thread(target=self._run, name="sluice-heartbeat", daemon=True)

    def _queues(self) -> list[str]:
        return list(self._app.amqp.queues.consume_from.keys())

    def beat_once(self, client: redis.Redis) -> None:
        """Announce the node alive and keep the messages of the batches it runs from being re-delivered."""
        now = time.time()
        write_heartbeat(client, self.node, self._queues(), now)
        # A quarter of the visibility timeout between restarts (never less than a beat) leaves
        # three beats' worth of slack; each restart reads kombu's whole unacked hash.
        if now >= self._visible_until - 0.75 * self._settings.visibility_timeout_s:
            keep_visible(client, [task.decode() for task in client.hkeys(keys.inflight(self.node))], now)
            self._visible_until = now + self._settings.visibility_timeout_s

    def _run(self) -> None:
        # No retries: a beat that cannot be written is skipped, the next one is due soon.
        client = redis.Redis.from_url(self._settings.redis_url)
        failing = False
        while not self._stop.is_set():
            try:
                self.beat_once(client)
                if failing:
                    log.info("heartbeat of %s written again", self.node)
                failing = False
            except redis.RedisError as e:  # Redis stalls or restarts: said once, not every beat
                if not failing:
                    log.warning("heartbeat of %s failed: %s: %s", self.node, type(e).__name__, e)
                failing = True
            self._stop.wait(self._settings.heartbeat_interval_s)
        try:
            client.hdel(keys.NODES, self.node)
        except redis.RedisError:
            pass

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def give_back_previous_life(app: Celery, settings: Settings, node: str) -> int:
    """Before a node consumes anything: batches still in flight under its name died with its last process.

    Returns how many deliveries were settled (acknowledged as recorded, or given back).
    """
    from .services import Services

    return settle_node(Services.connect(settings, app), node)


def settle_node(services: "Services", node: str) -> int:
    """Settle what `node` holds in flight and is not running (`jobs/settle.py`); returns how many."""
    from celery.worker import state as worker_state

    from .settle import settle_deliveries

    running = {request.id for request in worker_state.active_requests}
    try:
        settled = settle_deliveries(services, node, running)
    except (redis.RedisError, KombuError, OSError):  # Redis or the broker away again: beat gives them
        # back too, once this node's heartbeat has been silent long enough
        log.exception("settling the deliveries %s held failed", node)
        return 0
    return len(settled.acknowledged) + settled.given_back


class SettleOnConnect(bootsteps.StartStopStep):
    """A consumer step: each time the node's consumer (re)connects to Redis, before it takes any
    message, settle what the node held when its connection broke (or its last process died)."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, parent: Any, settings: Settings | None = None, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self._settings = settings
        self._services: "Services | None" = None

    def start(self, parent: Any) -> None:
        from .services import Services

        if self._settings is None:
            return
        if self._services is None:
            self._services = Services.connect(self._settings, parent.app)
        settled = settle_node(self._services, parent.hostname)
        if settled:
            log.warning("node %s settled %d delivery(ies) it held before (re)connecting", parent.hostname, settled)


def install_worker_hooks(app: Celery, settings: Settings) -> None:
    """Connect the signal handlers and the consumer step; they act only inside a worker of this app."""
    state: dict[str, Heartbeat] = {}

    class _SettleOnConnect(SettleOnConnect):
        def __init__(self, parent: Any, **kwargs: Any) -> None:
            super().__init__(parent, settings=settings, **kwargs)

    app.steps["consumer"].add(_SettleOnConnect)

    @signals.setup_logging.connect(weak=False)
    def _json_lines(loglevel: int | str | None = None, **_: object) -> None:
        # Connected, this replaces Celery's own log set-up (worker and beat): JSON lines on stderr.
        configure_json_logging(loglevel or logging.INFO)

    @signals.worker_ready.connect(weak=False)
    def _start_heartbeat(sender, **_: object) -> None:
        if sender.app is not app:
            return
        heartbeat = state["heartbeat"] = Heartbeat(app, settings, sender.hostname)
        heartbeat.start()
        log.info("sluice node %s serving %s", sender.hostname, heartbeat._queues())

    @signals.worker_shutdown.connect(weak=False)
    def _stop_heartbeat(sender, **_: object) -> None:
        heartbeat = state.pop("heartbeat", None)
        if heartbeat is not None:
            heartbeat.stop()
