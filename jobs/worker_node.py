"""Hooks that make a Celery worker a Sluice node: the maintenance queue, the heartbeat, and giving
back what the node's previous life held when it died."""

from __future__ import annotations

import logging
import threading
import time

import redis
from celery import Celery, signals

from predictors_runtime.log import configure_json_logging

from .placement import MAINTENANCE_QUEUE, NODES_KEY, write_heartbeat
from .settings import Settings

log = logging.getLogger(__name__)


class Heartbeat:
    """A daemon thread in the node's main process announcing it alive every few seconds."""

    def __init__(self, app: Celery, settings: Settings, node: str) -> None:
        self._app = app
        self._settings = settings
        self.node = node
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sluice-heartbeat", daemon=True)

    def _queues(self) -> list[str]:
        return list(self._app.amqp.queues.consume_from.keys())

    def beat_once(self, client: redis.Redis) -> None:
        write_heartbeat(client, self.node, self._queues(), time.time())

    def _run(self) -> None:
        client = redis.Redis.from_url(self._settings.redis_url)
        while not self._stop.is_set():
            try:
                self.beat_once(client)
            except Exception:
                log.exception("heartbeat of %s failed", self.node)
            self._stop.wait(self._settings.heartbeat_interval_s)
        try:
            client.hdel(NODES_KEY, self.node)
        except Exception:
            pass

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def give_back_previous_life(app: Celery, settings: Settings, node: str) -> int:
    """Before a node consumes anything: batches still in flight under its name died with its last process."""
    from .services import Services

    try:
        return Services.connect(settings, app).placement.give_back(node)
    except Exception:  # beat gives them back too, once this node's old heartbeat has expired
        log.exception("giving back the batches of %s's previous run failed", node)
        return 0


def install_worker_hooks(app: Celery, settings: Settings) -> None:
    """Connect the signal handlers; they fire only inside a worker of this app."""
    state: dict[str, Heartbeat] = {}

    @signals.setup_logging.connect(weak=False)
    def _json_lines(loglevel: int | str | None = None, **_: object) -> None:
        # Connected, this replaces Celery's own log set-up (worker and beat): JSON lines on stderr.
        configure_json_logging(loglevel or logging.INFO)

    @signals.celeryd_after_setup.connect(weak=False)
    def _prepare_node(sender: str, instance, **_: object) -> None:
        if instance.app is not app:
            return
        app.amqp.queues.select_add(MAINTENANCE_QUEUE)
        give_back_previous_life(app, settings, sender)

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
