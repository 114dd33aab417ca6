"""A worker node that takes nothing while its queues hold messages ends itself, to be restarted.

Celery workers have stopped consuming for good after a Redis failover or a dropped connection
(celery#8030, #8384, #10502: kombu lost the poll of the reconnected socket). Sluice's transport
options let kombu notice a dead BRPOP connection (`jobs.transport.broker.transport_options`), but a bug of
that kind leaves a node alive, heartbeating and idle, with its jobs' batches waiting in Redis.

So the node's heartbeat thread also watches for that: no message received, no batch running or
reserved, and messages waiting in a queue the node consumes, at every look for
`SLUICE_WORKER_STALL_S` seconds. Then the node ends itself (a warm shutdown, then a hard exit if
that hangs), and its supervisor (`sluice up`'s `restart_dead_workers`, compose's `restart:
unless-stopped`, or the operator's) starts it again: a fresh connection, and the node's next
life settles what it held and consumes its jobs' queues from the start (`jobs/nodes/worker_node.py`).
Ending an idle node costs nothing; reconnecting from inside Celery's consumer is what failed.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class StallWatch:
    """Tells, at each look, whether the node has been idle past `after_s` with work waiting for it."""

    def __init__(self, after_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.after_s = after_s
        self._clock = clock
        self._progress = clock()  # the last time the node took something, or had nothing to take

    def restart(self) -> None:
        """Count from now: the node received a message (Celery's `task_received`), or its queues
        could not be read (Redis away: a node cannot take anything then, and ending it would not help)."""
        self._progress = self._clock()

    def stalled(self, busy: bool, waiting: int) -> bool:
        """One look: `busy` (a batch running or reserved), `waiting` (messages in its queues)."""
        now = self._clock()
        if busy or waiting == 0:
            self._progress = now
            return False
        return now - self._progress >= self.after_s
