"""The Redis transport of Sluice's Celery app: kombu's, with one Redis client per channel.

kombu's Redis channel builds a new `redis.Redis` for every acknowledgement, every reservation
of a delivered message and every single publish (`conn_or_acquire` without a client). Building
one copies redis-py's table of ~170 response callbacks, about 0.2 ms of CPU each time: with
batches of a few milliseconds that was a tenth of a worker's time, spent twice per batch, and
on the critical path between two batches (profiled with `bench/onnx_batch.py`). The channel
here builds that client once and keeps it; it uses the channel's connection pool as before, and
a `redis.Redis` on a pool is safe to share between threads.

Only plain `redis://` URLs use it; other schemes (`rediss://`, whose TLS defaults kombu derives
from the scheme name, `redis+socket://`, `sentinel://`) keep kombu's own transport.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator
from urllib.parse import urlparse

from kombu.transport import redis as kombu_redis

TRANSPORT_PATH = "jobs.broker:Transport"


class Channel(kombu_redis.Channel):
    """A kombu Redis channel that reuses one client for its own commands."""

    _own_client: Any = None

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        if client:
            yield client
            return
        if self._own_client is None:
            self._own_client = self._create_client()
        yield self._own_client


class Transport(kombu_redis.Transport):
    Channel = Channel


def transport_for(broker_url: str) -> str | None:
    """The transport to configure for `broker_url`: Sluice's for redis://, else kombu's choice (None)."""
    return TRANSPORT_PATH if urlparse(broker_url).scheme == "redis" else None
