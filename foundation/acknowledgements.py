"""Answers that are promises: a write is acknowledged to its caller only once a Redis replica has it.

Redis replicates asynchronously: a primary answers a write before any replica has it, and a
failover promotes a replica that may lack the last writes the primary answered. A job submission
acknowledged in that window, then lost, is work the caller believes queued. So before Sluice answers
a write (a submission, a deploy, a delete, a stop) it asks Redis `WAIT`.

`WAIT` counts the replicas that have this connection's last write. The answer's own writes went out
on other connections of the pool, so a fence comes first: one `INCR` on the connection that then
waits. Replication is one ordered stream, so a replica that has the fence has every write the
primary took before it, this answer's included.

How many replicas to wait for: `SLUICE_ACK_REPLICAS` (a number, `0` for none, or `auto`, the
default: as many as the primary reports connected, read at most every `REPLICAS_READ_EVERY_S`). With
no replica there is nothing to wait for and no cost but that read. How long: `SLUICE_ACK_TIMEOUT_MS`.
Past it the caller gets 503 `not_acknowledged`: the write may or may not have taken.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from . import keys
from .errors import NotAcknowledged

if TYPE_CHECKING:
    import redis

AUTO = "auto"
DEFAULT_TIMEOUT_MS = 1000
REPLICAS_READ_EVERY_S = 2.0


@dataclass(frozen=True)
class AckPolicy:
    """How many replicas must confirm a write (`None`: as many as are connected) and for how long."""

    replicas: int | None = None
    timeout_ms: int = DEFAULT_TIMEOUT_MS

    @classmethod
    def parse(cls, replicas: str | None, timeout_ms: str | None) -> AckPolicy:
        """From the settings' text; a value that is not a count or `auto` is refused, naming the setting."""
        wanted: int | None = None
        text = (replicas or AUTO).strip().lower()
        if text != AUTO:
            if not text.isdigit():
                raise ValueError(f"SLUICE_ACK_REPLICAS must be a number of replicas or {AUTO!r} (got {replicas!r})")
            wanted = int(text)
        limit = DEFAULT_TIMEOUT_MS
        if timeout_ms:
            if not timeout_ms.strip().isdigit() or int(timeout_ms) < 1:
                raise ValueError(f"SLUICE_ACK_TIMEOUT_MS must be a whole number of milliseconds > 0 "
                                 f"(got {timeout_ms!r})")
            limit = int(timeout_ms)
        return cls(wanted, limit)


class Acknowledgements(ABC):
    """`confirm()` returns once enough replicas have every write this process made before the call,
    or raises `NotAcknowledged`."""

    @abstractmethod
    def confirm(self, retry_by: str | None = None) -> None:
        """Wait until the replicas have what was written; `retry_by`, the caller's idempotency key,
        goes into the refusal's message."""


def refusal(confirmed: int, wanted: int, timeout_ms: int, retry_by: str | None) -> NotAcknowledged:
    """What a caller is told when too few replicas confirmed its write in time."""
    retry = (f"; retry with the same Idempotency-Key ({retry_by}) to get the same result either way"
             if retry_by else "; retrying it is safe only if doing it twice is")
    return NotAcknowledged(
        f"Redis took the write but {confirmed} of {wanted} replica(s) confirmed it within {timeout_ms} ms, "
        f"so a failover could still lose it: it may or may not have taken{retry}")


@dataclass
class RedisAcknowledgements(Acknowledgements):
    """`WAIT` after a fence write, for the replicas the policy wants."""

    client: redis.Redis
    policy: AckPolicy = field(default_factory=AckPolicy)
    clock: Callable[[], float] = time.monotonic
    _connected: int = 0
    _read_at: float | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def wanted(self) -> int:
        """The replicas a write waits for now."""
        if self.policy.replicas is not None:
            return self.policy.replicas
        now = self.clock()
        with self._lock:
            if self._read_at is not None and now - self._read_at < REPLICAS_READ_EVERY_S:
                return self._connected
        # Read outside the lock: a slow Redis must not hold every other request thread of this
        # process behind this one (two threads may read at once; either answer is current).
        connected = int(self.client.info("replication").get("connected_slaves", 0))
        with self._lock:
            self._connected, self._read_at = connected, now
        return connected

    def confirm(self, retry_by: str | None = None) -> None:
        wanted = self.wanted()
        if wanted <= 0:
            return
        with self.client.pipeline(transaction=False) as pipe:
            pipe.incr(keys.ACK_FENCE)
            pipe.wait(wanted, self.policy.timeout_ms)
            _, confirmed = pipe.execute()
        if int(confirmed) >= wanted:
            return
        if self.policy.replicas is None:
            # Following the primary's own count: a replica it no longer reports (dropped, or this is
            # a newly promoted primary whose old replica became it) is not waited for. A replica it
            # still reports, but that does not confirm (a broken link), is.
            with self._lock:
                self._read_at = None
            wanted = self.wanted()
            if int(confirmed) >= wanted:
                return
        raise refusal(int(confirmed), wanted, self.policy.timeout_ms, retry_by)
