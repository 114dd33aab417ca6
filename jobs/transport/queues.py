"""The job queues on the broker, beyond publishing and consuming: who consumes them, dropping them,
and settling messages that nodes took but never acknowledged.

Each job's batches travel on a queue of their own (`job.<id>`); placement tells nodes to consume it
(Celery's `add_consumer` broadcast) and to stop, and drops it once the job has ended. A node that
dies, or loses its connection, leaves messages in kombu's unacknowledged hash: they are given back
to the head of their queue, or acknowledged when their work is already recorded (`jobs/transport/settle.py`).

`JobQueues` is what the rest of jobs/ asks of the broker; `CeleryJobQueues` does it through the
Celery app (kombu's Redis transport), `MemoryJobQueues` (`jobs/transport/memory.py`) records what it
was asked, for fast tests of placement and settling. The broker's own behaviour (messages put back,
acknowledged) is tested against real kombu and Redis in tests/integration/.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Protocol

from celery import Celery

from jobs.transport.broker import acknowledge_tags, unacked_tags


class JobQueues(Protocol):
    """What placement and settling ask of the broker's job queues."""

    def add_consumers(self, queue: str, nodes: list[str]) -> None:
        """Tell `nodes` to consume `queue` (idempotent; a broker error is raised)."""

    def cancel_consumers(self, queue: str, nodes: list[str]) -> None:
        """Tell `nodes` to stop consuming `queue`."""

    def drop(self, queue: str) -> None:
        """Delete a job queue with every message still in it."""

    def give_back(self, task_ids: Collection[str]) -> None:
        """Put the unacknowledged messages of these tasks back where nodes take them next
        (a no-op for one acknowledged meanwhile)."""

    def acknowledge(self, task_ids: Collection[str]) -> None:
        """Acknowledge the unacknowledged messages of these tasks: never to be redelivered."""


class CeleryJobQueues:
    """`JobQueues` through a Celery app: control broadcasts and kombu's Redis channel."""

    def __init__(self, celery: Celery) -> None:
        self._celery = celery

    def add_consumers(self, queue: str, nodes: list[str]) -> None:
        self._celery.control.add_consumer(queue, destination=nodes, reply=False)

    def cancel_consumers(self, queue: str, nodes: list[str]) -> None:
        self._celery.control.cancel_consumer(queue, destination=nodes, reply=False)

    def drop(self, queue: str) -> None:
        """kombu handles the priority sub-queues of `queue` too."""
        with self._celery.connection_for_write() as conn:
            channel = conn.default_channel
            channel.queue_purge(queue)
            channel.queue_delete(queue)

    def give_back(self, task_ids: Collection[str]) -> None:
        """Restored to the end BRPOP takes next."""
        if not task_ids:
            return
        with self._celery.connection_for_write() as conn:
            channel = conn.default_channel
            for tag in unacked_tags(channel, task_ids).values():
                channel.qos.restore_by_tag(tag)

    def acknowledge(self, task_ids: Collection[str]) -> None:
        if not task_ids:
            return
        with self._celery.connection_for_write() as conn:
            channel = conn.default_channel
            acknowledge_tags(channel, unacked_tags(channel, task_ids).values())
