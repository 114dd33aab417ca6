"""A node's store answers used when its event loop sees them arrive, not waited for by its task.

A node runs its batches on its consumer's event loop (Celery's solo pool): kombu's hub, which
waits on the broker's sockets for the next message. A batch's record is sent at the end of its
task (`jobs/store/answers.py`) and its answer, which says whether the batch completed its job,
is left here: the hub watches the record's socket beside the broker's, so the node is already
taking its next message (the BRPOP on its way) while Redis runs the record. What the answer
decides (the completion task of a job the batch completed, the batch's figures) happens when it
arrives.

Rules that keep this as safe as waiting:
- Only on the loop's own thread and process (`attach`, from the consumer's start): a task run
  elsewhere (another pool, a forked child, a test calling the runtime) is told to use its
  answers at once.
- Every pending answer is used before the node starts another task (`settle`, called by the
  runtime first thing), and when its consumer stops: no answer waits behind a batch, nor is
  left unread at exit.
- A use that fails is logged, never raised into the hub (it would stop the consumer): the record
  itself is done by then, and what a lost completion send leaves undone beat sends again
  (`beat/completions.py`).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from jobs.store.answers import Answer

log = logging.getLogger(__name__)

T = TypeVar("T")


class LoopAnswers:
    """Store answers left to the node's event loop (`jobs.batch.steps.LaterAnswers`; see the module's docstring)."""

    def __init__(self) -> None:
        self._hub: Any = None
        self._thread = 0
        self._pid = 0
        self._pending: dict[int, tuple[Answer[Any], Callable[[Any], None]]] = {}  # by socket, oldest first

    def attach(self, hub: Any) -> None:
        """The loop of this thread (kombu's `Hub`) watches the answers left here from now on."""
        self._hub, self._thread, self._pid = hub, threading.get_ident(), os.getpid()

    def detach(self) -> None:
        """The loop stops: every answer pending is used now, and none is left to it any more."""
        self.settle()
        self._hub = None

    def _on_loop(self) -> bool:
        return self._hub is not None and threading.get_ident() == self._thread and os.getpid() == self._pid

    def later(self, answer: Answer[T], use: Callable[[T], None]) -> bool:
        """`LaterAnswers.later`: watched by the loop when called on the loop's thread, else False."""
        fd = answer.fileno()
        # A socket in `_pending` holds an unread answer (its connection is not back in the pool): not expected.
        if fd is None or not self._on_loop() or fd in self._pending:
            return False
        self._pending[fd] = (answer, use)
        self._hub.add_reader(fd, self._use, fd)
        return True

    def settle(self) -> None:
        """Use every pending answer now, oldest first, waiting for those still on their way."""
        while self._pending:
            self._use(next(iter(self._pending)))

    @property
    def pending(self) -> int:
        return len(self._pending)

    def _use(self, fd: int) -> None:
        entry = self._pending.pop(fd, None)
        if entry is None:
            return
        if self._hub is not None:
            self._hub.remove_reader(fd)
        answer, use = entry
        try:
            use(answer.answer())
        except Exception:  # the hub's callback must not raise; see the module's docstring
            log.exception("using a store answer failed")


NODE_LOOP = LoopAnswers()
"""This process's: attached by the node's consumer step (`jobs/nodes/worker_node.py`), used by its runtime."""
