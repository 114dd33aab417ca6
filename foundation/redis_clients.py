"""Riding out Redis stalls and restarts: a client that repeats a command for a while before giving up.

redis-py's client, as `Redis.from_url` builds it, gives up after one socket timeout (5 s) and
does not retry. But a Redis that stalls (a slow fork, a paused VM or container, SIGSTOP) still
runs every command it was sent once it wakes up: a timeout loses the *reply*, not the write. A
Redis that restarts on its append-only file loses nothing it acknowledged, only the connections.
Either way the caller's best move is to send the command again until Redis answers, for a
bounded time (`Settings.redis_retry_s`, `SLUICE_REDIS_RETRY_S`).

That is only safe because every command Sluice sends through this client may run twice: plain
writes are idempotent (HSET, SADD, EXPIRE), and the job store's scripts carry a token per call so
that a repeat of a call that already ran answers what the first run answered (`jobs/store.py`).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, TypeVar

import redis
from redis.exceptions import AuthorizationError
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from foundation.errors import NotReady, SluiceError

log = logging.getLogger(__name__)

T = TypeVar("T")

# Errors after which a command may succeed if sent again: the connection broke, or no reply came
# in time, or Redis is still loading its data after a restart (BusyLoadingError is a ConnectionError).
TRANSIENT_ERRORS: tuple[type[Exception], ...] = (redis.ConnectionError, redis.TimeoutError, TimeoutError)
# ConnectionErrors that sending again cannot cure.
_PERMANENT_ERRORS: tuple[type[Exception], ...] = (redis.AuthenticationError, AuthorizationError)

FIRST_DELAY_S = 0.05
MAX_DELAY_S = 1.0


class RedisUnavailable(NotReady, redis.ConnectionError):
    """Redis did not answer for the whole retry window (still a `redis.ConnectionError` to callers that catch those)."""


def one_line(error: BaseException) -> str:
    """What went wrong, in one line: the message a job status or a log line should carry."""
    if isinstance(error, SluiceError):
        text = error.message
    elif isinstance(error, redis.RedisError):
        text = f"Redis failed: {type(error).__name__}: {error}"
    else:
        text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    return " ".join(text.split())


class RideOut(Retry):
    """redis-py's retry policy, bounded by time instead of by a count.

    Sends a command again, with exponential backoff, until `within_s` has passed since the call
    began; then raises `RedisUnavailable` from the last error. Each attempt can itself last up to
    the socket timeout, so a stalled Redis is asked about every socket timeout, and a stopped one
    (connection refused) every `MAX_DELAY_S` at most.
    """

    def __init__(
        self, within_s: float, first_delay_s: float = FIRST_DELAY_S, max_delay_s: float = MAX_DELAY_S,
        sleep: Callable[[float], Any] = time.sleep, clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(ExponentialBackoff(cap=max_delay_s, base=first_delay_s / 2), retries=-1,
                         supported_errors=TRANSIENT_ERRORS)
        self.within_s = within_s
        self._sleep = sleep
        self._clock = clock

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, RideOut) and self.within_s == other.within_s and super().__eq__(other)

    __hash__ = Retry.__hash__

    def call_with_retry(
        self,
        do: Callable[[], T],
        fail: Callable[..., Any],
        is_retryable: Callable[[Exception], bool] | None = None,
        with_failure_count: bool = False,
    ) -> T:
        """Same contract as `Retry.call_with_retry`; local state only, so nested calls (a connect
        inside a command) are safe."""
        deadline = self._clock() + self.within_s
        failures = 0
        while True:
            try:
                return do()
            except self._supported_errors as error:
                if isinstance(error, _PERMANENT_ERRORS) or (is_retryable and not is_retryable(error)):
                    raise
                failures += 1
                if with_failure_count:
                    fail(error, failures)
                else:
                    fail(error)
                if isinstance(error, RedisUnavailable):  # a nested call already used up the window
                    raise
                delay = self._backoff.compute(failures)
                if self._clock() + delay >= deadline:
                    raise RedisUnavailable(
                        f"Redis did not answer for {self.within_s:g} s ({type(error).__name__}: {error})"
                    ) from error
                if failures == 1:
                    log.warning("Redis did not answer (%s: %s); retrying for up to %g s",
                                type(error).__name__, error, self.within_s)
                self._sleep(delay)


def connect(url: str, retry_s: float, **kwargs: Any) -> redis.Redis:
    """A client for `url` whose every command rides out Redis failures for up to `retry_s` seconds."""
    return redis.Redis.from_url(url, retry=RideOut(retry_s), **kwargs)
