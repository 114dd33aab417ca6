"""Server-side batching inside one replica process: concurrent requests gathered into one call.

The requests are the threads of the process (in a replica, the greenlets of gunicorn's gevent
worker, which patches `threading` so that the same code waits cooperatively). The first request
to arrive opens a window and becomes its leader; requests arriving while the window is open
join it. The window closes when it holds `max_batch_size` requests or `interval_s` after it
opened, whichever comes first. The leader then runs the batch on its own thread and hands
every member its own element of the result.

What this guards against, from the history of its predecessors: a batch that fails in any
way (predict raises, returns something that is not a list, or a list of the wrong length)
fails every one of its requests, never some; no request ever waits without a bound (its
deadline, else `max_wait_s`); a request's answer is the element at its own index, never
another's. Batches run one at a time, as in Cortex, so `predict` is never called concurrently
by the batcher; requests arriving while a batch runs gather into the next window.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from foundation.errors import PredictorError, RequestTimeout, SluiceError

T = TypeVar("T")

log = logging.getLogger("sluice.batching")

# Longest a request waits for its batch when it has no deadline of its own.
DEFAULT_MAX_WAIT_S = 300.0

# The deadline (epoch seconds) of the request the current thread serves, for batching done
# below `predict` (a TensorFlow predictor's client calls), which is not handed the request.
request_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar("sluice_request_deadline",
                                                                                default=None)


class BatchFailed(PredictorError):
    """The batch a request belonged to failed; `cause` is what `predict` raised, if it raised.

    Each request of the batch receives its own instance, so no two threads raise one object.
    """

    def __init__(self, message: str, cause: BaseException | None = None, size: int = 0) -> None:
        super().__init__(message)
        self.cause = cause
        self.size = size


class _Failure:
    """How a member's wait ends when its batch failed: a fresh exception per member."""

    __slots__ = ("cause", "message", "size", "timeout")

    def __init__(self, message: str, cause: BaseException | None = None, size: int = 0,
                 timeout: bool = False) -> None:
        self.message = message
        self.cause = cause
        self.size = size
        self.timeout = timeout

    def error(self) -> SluiceError:
        if self.timeout:
            return RequestTimeout(self.message)
        return BatchFailed(self.message, self.cause, self.size)


class _Window:
    """One batch: its members (in arrival order) and, once run, their outcomes."""

    __slots__ = ("deadlines", "done", "full", "items", "outcomes")

    def __init__(self) -> None:
        self.items: list[Any] = []
        self.deadlines: list[float | None] = []
        self.full = threading.Event()   # set when max_batch_size members joined
        self.done = threading.Event()   # set once outcomes are in place
        self.outcomes: list[Any] = []


class Batcher(Generic[T]):
    """Gathers concurrent `submit` calls into calls of `run(items) -> list of results`.

    `run` receives the items of one batch in arrival order and must return a list (or tuple)
    with one result per item. `submit` blocks its caller until its own result is known and
    returns it, or raises: `BatchFailed` when the batch failed, `RequestTimeout` when the
    caller's deadline passed first, `PredictorError` when no answer came within `max_wait_s`.
    Deadlines are epoch seconds (`time.time()`); an item past its deadline when its batch
    starts is left out of the batch. A failed batch is logged once (with the traceback when
    `run` raised), by the thread that ran it; `label(item)` names the items in that line.
    """

    def __init__(self, run: Callable[[list[T]], Sequence[Any]], max_batch_size: int, interval_s: float,
                 *, max_wait_s: float = DEFAULT_MAX_WAIT_S, label: Callable[[T], str] | None = None,
                 on_batch: Callable[[int], None] | None = None) -> None:
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be at least 1")
        if interval_s <= 0:
            raise ValueError("interval_s must be greater than 0")
        self._run = run
        self.max_batch_size = max_batch_size
        self.interval_s = interval_s
        self.max_wait_s = max_wait_s
        self._label = label
        self._on_batch = on_batch  # told each batch's size as it starts (the replica's figures)
        self._lock = threading.Lock()       # guards _open
        self._running = threading.Lock()    # one batch at a time
        self._open: _Window | None = None

    def submit(self, item: T, deadline: float | None = None) -> Any:
        """Join the open window (or open one), wait for the batch, return this item's result."""
        with self._lock:
            window = self._open
            leader = window is None
            if window is None:
                window = self._open = _Window()
            index = len(window.items)
            window.items.append(item)
            window.deadlines.append(deadline)
            if index + 1 >= self.max_batch_size:
                self._open = None
                window.full.set()
        if leader:
            self._lead(window)
        return self._await(window, index, deadline)

    # --- the leader --------------------------------------------------------------------------

    def _lead(self, window: _Window) -> None:
        """Close the window when it is full or its interval has passed, then run it."""
        window.full.wait(self.interval_s)
        with self._lock:
            if self._open is window:
                self._open = None
        # Nobody joins a window that is no longer open: its lists are final from here on.
        outcomes: list[Any] | None = None
        try:
            if self._running.acquire(timeout=self._patience(window)):
                try:
                    outcomes = self._execute(window)
                finally:
                    self._running.release()
            else:
                message = "the batch before this one did not finish in time"
                outcomes = [_Failure(message, timeout=d is not None, size=len(window.items))
                            for d in window.deadlines]
        finally:
            if outcomes is None:  # something unexpected (even a BaseException) escaped: nobody may hang
                outcomes = [_Failure("the batch failed unexpectedly", size=len(window.items))] * len(window.items)
            window.outcomes = outcomes
            window.done.set()

    def _patience(self, window: _Window) -> float:
        """How long the leader waits for the batch before its own to finish: until its last member gives up."""
        now = time.time()
        return max(0.0, *(self.max_wait_s if d is None else d - now for d in window.deadlines))

    def _execute(self, window: _Window) -> list[Any]:
        now = time.time()
        expired = _Failure("the request's deadline passed before its batch ran", timeout=True)
        live = [i for i, d in enumerate(window.deadlines) if d is None or d > now]
        outcomes: list[Any] = [expired] * len(window.items)
        if not live:
            return outcomes
        items = [window.items[i] for i in live]
        size = len(items)
        if self._on_batch is not None:
            self._on_batch(size)
        try:
            results = self._run(items)
        except Exception as e:  # noqa: BLE001 - the user's predict may raise anything: the batch fails
            failure = _Failure(f"predict raised {type(e).__name__}: {e}", cause=e, size=size)
            self._log(failure, items, e)
            for i in live:
                outcomes[i] = failure
            return outcomes
        if not isinstance(results, (list, tuple)):
            failure = _Failure(
                f"with server_side_batching, predict must return a list of one result per request; "
                f"it returned a {type(results).__name__} for a batch of {size}", size=size)
        elif len(results) != size:
            failure = _Failure(
                f"with server_side_batching, predict must return one result per request; "
                f"it returned {len(results)} results for a batch of {size}", size=size)
        else:
            for i, result in zip(live, results, strict=False):
                outcomes[i] = result
            return outcomes
        self._log(failure, items, None)
        for i in live:
            outcomes[i] = failure
        return outcomes

    def _log(self, failure: _Failure, items: list[T], error: BaseException | None) -> None:
        extra: dict[str, Any] = {"batch_size": len(items)}
        if self._label is not None:
            extra["batch"] = [self._label(item) for item in items]
        log.error("server-side batch failed: %s", failure.message, extra=extra,
                  exc_info=(type(error), error, error.__traceback__) if error is not None else None)

    # --- every member ------------------------------------------------------------------------

    def _await(self, window: _Window, index: int, deadline: float | None) -> Any:
        if not window.done.is_set():
            timeout = self.max_wait_s if deadline is None else max(0.0, deadline - time.time())
            if not window.done.wait(timeout):
                if deadline is not None:
                    raise RequestTimeout("the request's deadline passed while its batch was running")
                raise PredictorError(f"the request's batch gave no answer within {self.max_wait_s:g} s")
        outcome = window.outcomes[index]
        if isinstance(outcome, _Failure):
            raise outcome.error()
        return outcome
