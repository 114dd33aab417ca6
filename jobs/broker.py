"""The Redis transport of Sluice's Celery app: kombu's, with one Redis client per channel.

kombu's Redis channel builds a new `redis.Redis` for every acknowledgement, every reservation
of a delivered message and every single publish (`conn_or_acquire` without a client). Building
one copies redis-py's table of ~170 response callbacks, about 0.2 ms of CPU each time: with
batches of a few milliseconds that was a tenth of a worker's time, spent twice per batch, and
on the critical path between two batches (profiled with `bench/onnx_batch.py`). The channel
here builds that client once and keeps it; it uses the channel's connection pool as before, and
a `redis.Redis` on a pool is safe to share between threads.

It also reads and acknowledges unacknowledged messages by task id, for a node settling the
deliveries it held when its connection broke (`jobs/settle.py`).

Only plain `redis://` URLs use it; other schemes (`rediss://`, whose TLS defaults kombu derives
from the scheme name, `redis+socket://`, `sentinel://`) keep kombu's own transport.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any
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
            self._own_client = self._create_client()  # type: ignore[no-untyped-call]  # kombu's, untyped
        yield self._own_client


class Transport(kombu_redis.Transport):
    Channel = Channel


def transport_for(broker_url: str) -> str | None:
    """The transport to configure for `broker_url`: Sluice's for redis://, else kombu's choice (None)."""
    return TRANSPORT_PATH if urlparse(broker_url).scheme == "redis" else None


def unacked_tags(channel: Any, task_ids: Iterable[str]) -> dict[str, str]:
    """Celery task id -> kombu's delivery tag, for those of `task_ids` whose message is unacknowledged.

    kombu's Redis transport keeps each unacknowledged message in a hash (tag -> JSON of the
    message, exchange and routing key) until it is acknowledged; Celery does not tell a task its
    tag, so the messages are found by the task id in their headers. The hash holds one entry per
    task running anywhere, so it stays small.
    """
    wanted = set(task_ids)
    if not wanted:
        return {}
    with channel.conn_or_acquire() as client:
        return _tags_by_task(client.hgetall(channel.unacked_key), wanted)


def _tags_by_task(unacked: dict[Any, Any], wanted: set[str]) -> dict[str, str]:
    tags: dict[str, str] = {}
    for tag, raw in unacked.items():
        try:
            task_id = (json.loads(raw)[0].get("headers") or {}).get("id")
        except (ValueError, IndexError, TypeError, AttributeError):
            continue
        if task_id in wanted:
            tags[task_id] = tag.decode() if isinstance(tag, bytes) else tag
    return tags


def keep_visible(client: Any, task_ids: Iterable[str], now: float) -> int:
    """Restart the visibility clock of the unacknowledged messages of these tasks; how many there were.

    kombu puts a message back on its queue once it has been unacknowledged for the visibility
    timeout, whether or not the task is still running: a batch running longer would run twice.
    A live node calls this for what it holds at every heartbeat, so its messages never look
    abandoned; a dead node stops, and its messages come back (Sluice gives them back sooner,
    see `jobs/nodes.py`). `XX`: a message acknowledged meanwhile is not put back in the index.
    """
    wanted = set(task_ids)
    if not wanted:
        return 0
    tags = _tags_by_task(client.hgetall(Channel.unacked_key), wanted)
    if tags:
        client.zadd(Channel.unacked_index_key, dict.fromkeys(tags.values(), now), xx=True)
    return len(tags)


def acknowledge_tags(channel: Any, tags: Iterable[str]) -> None:
    """Acknowledge messages by tag from any process: off kombu's unacknowledged hash and its index,
    never to be redelivered (what `Message.ack` does in the process that received them)."""
    tags = list(tags)
    if not tags:
        return
    with channel.conn_or_acquire() as client:
        pipe = client.pipeline()
        pipe.zrem(channel.unacked_index_key, *tags)
        pipe.hdel(channel.unacked_key, *tags)
        pipe.execute()
