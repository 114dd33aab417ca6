"""The Redis transport of Sluice's Celery app: kombu's, with one Redis client per channel.

kombu's Redis channel builds a new `redis.Redis` for every acknowledgement, every reservation
of a delivered message and every single publish (`conn_or_acquire` without a client). Building
one copies redis-py's table of ~170 response callbacks, about 0.2 ms of CPU each time: with
batches of a few milliseconds that was a tenth of a worker's time, spent twice per batch, and
on the critical path between two batches (profiled with `bench/onnx_batch.py`). The channel
here builds that client once and keeps it; it uses the channel's connection pool as before, and
a `redis.Redis` on a pool is safe to share between threads.

A batch's message costs no round trips of its own besides its BRPOP: the script that begins the
batch writes the message into kombu's unacknowledged hash, and the one that records it takes it out
(`BrokerReceipt`, `jobs/transport/delivery.py`), where kombu would write and acknowledge each in a
pipeline of its own. Only for a batch run as soon as it is taken (a node reserving one message at
a time): a message taken ahead and held has its entry written at once, as kombu writes it, so that
it is given back if the node dies. The window in which a node killed holds a message that is in no
hash grows from between the BRPOP and kombu's write to between the BRPOP and the batch's begin
(about a millisecond, but 60-250 ms for a node's first batch, which builds the node's worker
runtime first: `jobs/wiring.py`); beat sends a batch lost there again from its kept copy
(`beat/lost_batches.py`).

It also reads and acknowledges unacknowledged messages by task id, for a node settling the
deliveries it held when its connection broke (`jobs/transport/settle.py`), and can keep what a publish would
push on Redis instead of pushing it (`captured_messages`): how `jobs/transport/task_messages.py` learns the
exact message Celery and kombu make for a task, to make more like it without them.

`redis://` and `rediss://` URLs use it, and Redis Sentinel (kombu's `sentinel://` transport, the
same channel on a pool that asks the sentinels for the primary); over TLS the channel's connections
are SSL ones that check the server's certificate against `SLUICE_REDIS_CA` (`broker_ssl`: kombu
left to itself would take a `rediss://` URL without checking any certificate). Other schemes
(`redis+socket://`) keep kombu's own transport.

`broker_url` and `transport_options` turn `Settings.redis_address` into what kombu wants: the
sentinels as `sentinel://h1:p1;sentinel://h2:p2` with the master's name and the sentinels'
password in the transport options.
"""

from __future__ import annotations

import json
import ssl
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any
from urllib.parse import quote, urlparse

import orjson
import redis
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual

from foundation.redis_clients import HEARTBEAT, KEEPALIVE_OPTIONS, text
from foundation.settings import RedisAddress, Settings
from jobs.transport.delivery import BrokerReceipt

# The task whose messages get broker receipts (jobs/tasks.py `RUN_BATCH`; named here, below the tasks).
RECEIPT_TASK = "sluice.run_batch"

TRANSPORT_PATH = "jobs.transport.broker:Transport"
SENTINEL_TRANSPORT_PATH = "jobs.transport.broker:SentinelTransport"
# kombu's checks of its long-lived connections (a PING on the pub/sub one, an overdue BRPOP
# dropped) every this many seconds: a node's dead BRPOP connection is replaced within about
# twice this after its last reply.
BROKER_HEALTH_CHECK_S = 10


def _netloc(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def broker_url(address: RedisAddress) -> str:
    """kombu's URL for `address`: the sentinels, each as `sentinel://host:port` joined by `;`, the
    primary's password on the first; or the Redis URL, given `SLUICE_REDIS_PASSWORD` if it has none."""
    password = f":{quote(address.password, safe='')}@" if address.password else ""
    if address.sentinels:
        first, *others = (_netloc(host, port) for host, port in address.sentinels)
        return ";".join([f"sentinel://{password}{first}/0", *(f"sentinel://{netloc}" for netloc in others)])
    parsed = urlparse(address.url)
    if password and parsed.scheme.startswith("redis") and "@" not in parsed.netloc:
        return parsed._replace(netloc=password + parsed.netloc).geturl()
    return address.url


def transport_options(settings: Settings) -> dict[str, Any]:
    """kombu's transport options: Sluice's queue timings, and sockets that notice a vanished Redis.

    - `socket_timeout` is the store's retry window (`SLUICE_REDIS_RETRY_S`), not the store's
      5 s: kombu sends a publish once, so a Redis that stalls for less than the window (a slow
      fork, a paused VM) must be waited for, while a connection that died silently (a failover
      to another host, a dropped NAT entry) is given up after it rather than never.
    - `socket_keepalive` (with Sluice's probe timings) and `health_check_interval`: a dead peer is
      noticed on an idle connection, and kombu drops a BRPOP whose reply is overdue by that long
      (kombu 5.7).
    - No `retry_on_timeout`: kombu would then no longer pipeline a job's publishes (a pipeline
      sent again could queue a batch twice).
    - `priority_steps` `[0]`: one Redis list per queue. Sluice sends no task with a priority, so
      every message was on the queue's own list anyway; kombu's default of four lists per queue
      only made every BRPOP of a node name four keys per queue (kombu's work before each BRPOP
      was about 7% of a node's Python time per batch, profiled on `bench/onnx_batch.py`) and
      every length read four LLENs.
    """
    options: dict[str, Any] = {
        "visibility_timeout": int(settings.visibility_timeout_s),
        "polling_interval": settings.broker_poll_interval_s,
        "queue_order_strategy": "round_robin",
        "socket_timeout": settings.redis_retry_s,
        "socket_connect_timeout": HEARTBEAT.connect_timeout_s,
        "socket_keepalive": True,
        "socket_keepalive_options": KEEPALIVE_OPTIONS,
        "health_check_interval": BROKER_HEALTH_CHECK_S,
        "priority_steps": [0],
    }
    address = settings.redis_address
    if address.sentinels:
        options["master_name"] = address.master
        options["sentinel_kwargs"] = {
            "socket_timeout": HEARTBEAT.socket_timeout_s,
            "socket_connect_timeout": HEARTBEAT.connect_timeout_s,
            "socket_keepalive": True,
            "socket_keepalive_options": KEEPALIVE_OPTIONS,
            "password": address.sentinel_password,
            **({"ssl": True, **address.tls.redis_py()} if address.tls is not None else {}),
        }
    return options


def broker_ssl(address: RedisAddress) -> dict[str, Any] | None:
    """Celery's `broker_use_ssl` for `address`: the connections of Sluice's channel over TLS,
    checking the server's certificate; None for plain TCP."""
    if address.tls is None:
        return None
    # The same files as redis-py's clients; kombu wants the `ssl` module's constant, not its name.
    return {**address.tls.redis_py(), "ssl_cert_reqs": ssl.CERT_REQUIRED}


# While set (in one thread), what Sluice's channels would push on a queue's list: (its key, the message).
_captured: ContextVar[list[tuple[str, dict[str, Any]]] | None] = ContextVar("sluice_captured_messages", default=None)


@contextmanager
def captured_messages() -> Iterator[list[tuple[str, dict[str, Any]]]]:
    """Inside the block, this thread's publishes through Sluice's channels push nothing: each message
    is kept as kombu would have pushed it (the list's key, the message before its JSON encoding).
    Only `TRANSPORT_PATH` and `SENTINEL_TRANSPORT_PATH` channels keep them; another transport sends."""
    kept: list[tuple[str, dict[str, Any]]] = []
    token = _captured.set(kept)
    try:
        yield kept
    finally:
        _captured.reset(token)


class _OwnClient:
    """Reuses one client for a kombu Redis channel's own commands; keeps messages while `captured_messages`;
    wakes its waiting BRPOP when a queue is added to it.

    A node waits for messages in a BRPOP on the queues it consumes, for up to the poll interval
    (`SLUICE_BROKER_POLL_INTERVAL`, 0.1 s); a queue added meanwhile (a job placed on the node) was
    only read from the next BRPOP on. Now adding a queue ends the waiting BRPOP at once (Redis's
    `CLIENT UNBLOCK`, from the channel's other connection), so a job's nodes start as soon as they
    are told, not up to a poll interval later.
    """

    _own_client: Any = None
    _in_poll: Any = False  # kombu's: the connection whose BRPOP is waiting, if any

    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        kept = _captured.get()
        if kept is None:
            super()._put(queue, message, **kwargs)  # type: ignore[misc]  # kombu's Channel's
            return
        priority = self._get_message_priority(message, reverse=False)  # type: ignore[attr-defined]
        kept.append((self._q_for_pri(queue, priority), message))  # type: ignore[attr-defined]

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        if client:
            yield client
            return
        if self._own_client is None:
            self._own_client = self._create_client()  # type: ignore[attr-defined]  # kombu's Channel's
        yield self._own_client

    def basic_consume(self, queue: str, *args: Any, **kwargs: Any) -> Any:
        consumer = super().basic_consume(queue, *args, **kwargs)  # type: ignore[misc]  # kombu's Channel's
        if self._in_poll:
            self._end_waiting_brpop(self._in_poll)
        return consumer

    def _end_waiting_brpop(self, connection: Any) -> None:
        """End the BRPOP waiting on `connection` (found among Redis's clients by its address; where
        Redis sees another address, behind a proxy, the BRPOP ends by its own timeout instead)."""
        try:
            host, port = connection._sock.getsockname()[:2]
            addresses = {f"{host}:{port}", f"[{host}]:{port}"}  # as Redis writes an IPv4 or an IPv6 peer
            with self.conn_or_acquire() as client:
                for entry in client.client_list(_type="normal"):
                    if entry.get("addr") in addresses and entry.get("cmd") == "brpop":
                        client.execute_command("CLIENT", "UNBLOCK", entry["id"])
        except (redis.RedisError, OSError, AttributeError, TypeError):  # not allowed (ACLs), Redis away,
            pass  # no socket: the BRPOP ends by its timeout


# The receipts of the batch messages this process took and has not acknowledged, by delivery tag
# (what the transport is told) and by task id (what the task knows: Celery does not tell it the tag).
_receipts: dict[str, BrokerReceipt] = {}
_receipts_of_tasks: dict[str, BrokerReceipt] = {}
_receipts_lock = threading.Lock()


def receipt_for(task_id: str | None) -> BrokerReceipt | None:
    """The receipt of the batch message of task `task_id` taken in this process, None for another message."""
    if not task_id:
        return None
    with _receipts_lock:
        return _receipts_of_tasks.get(task_id)


def _unacked_entry(entry: list[Any]) -> str:
    """The JSON of an unacknowledged hash entry, as kombu's `json.dumps` would read back.

    orjson writes it ten times faster (a message is a few hundred bytes of JSON: the stdlib's took
    about 3% of a node's time per batch, profiled on `bench/onnx_batch.py`); a value orjson does
    not take (an integer past 64 bits in a header another client sent) goes through the stdlib."""
    try:
        return orjson.dumps(entry).decode()
    except orjson.JSONEncodeError:
        return json.dumps(entry)


class ReceiptQoS(kombu_redis.QoS):
    """kombu's acknowledgement emulation, leaving a batch message's writes to the batch's store calls.

    `append` keeps the entry of a batch message taken by a node that holds one message at a time
    instead of writing it (the batch's begin writes it); `ack` writes nothing for an entry the
    batch's record removed or that was never written; `reject` and `restore_unacked` write an
    entry still kept first, so that what they put back is there to be put back.
    """

    def append(self, message: Any, delivery_tag: str) -> None:
        headers = message.headers or {}
        if headers.get("task") != RECEIPT_TASK or not headers.get("id"):
            super().append(message, delivery_tag)  # type: ignore[no-untyped-call]  # kombu's
            return
        if self.prefetch_count == 1:  # run as soon as taken: its begin writes the entry
            delivery = message.delivery_info
            entry = _unacked_entry([message._raw, delivery["exchange"], delivery["routing_key"]])
            receipt = BrokerReceipt(delivery_tag, headers["id"], entry, time.time())
            virtual.QoS.append(self, message, delivery_tag)  # type: ignore[no-untyped-call]  # kombu's
        else:  # held ahead of its run: written now, so that it is given back if the node dies
            receipt = BrokerReceipt(delivery_tag, headers["id"], written=True)
            super().append(message, delivery_tag)  # type: ignore[no-untyped-call]  # kombu's
        with _receipts_lock:
            _receipts[delivery_tag] = _receipts_of_tasks[receipt.task_id] = receipt

    def _take(self, delivery_tag: str) -> BrokerReceipt | None:
        with _receipts_lock:
            receipt = _receipts.pop(delivery_tag, None)
            if receipt is not None and _receipts_of_tasks.get(receipt.task_id) is receipt:
                del _receipts_of_tasks[receipt.task_id]
            return receipt

    def _write(self, receipt: BrokerReceipt) -> None:
        """The entry kombu would have written when the message was taken."""
        with self.pipe_or_acquire() as pipe:
            pipe.zadd(self.unacked_index_key, {receipt.tag: receipt.taken_at}) \
                .hset(self.unacked_key, receipt.tag, receipt.unacked).execute()
        receipt.written = True

    def ack(self, delivery_tag: str) -> None:
        receipt = self._take(delivery_tag)
        if receipt is not None and (receipt.acknowledged or not receipt.written):
            virtual.QoS.ack(self, delivery_tag)  # type: ignore[no-untyped-call]  # nothing in Redis to remove
            return
        super().ack(delivery_tag)  # type: ignore[no-untyped-call]  # kombu's

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        receipt = self._take(delivery_tag)
        if receipt is not None and not receipt.written and not receipt.acknowledged:
            self._write(receipt)
        super().reject(delivery_tag, requeue=requeue)  # type: ignore[no-untyped-call]  # kombu's

    def restore_unacked(self, client: Any = None) -> None:
        for tag in list(self._delivered):
            receipt = self._take(tag)
            if receipt is not None and not receipt.written and not receipt.acknowledged:
                self._write(receipt)
        super().restore_unacked(client)  # type: ignore[no-untyped-call]  # kombu's


class Channel(_OwnClient, kombu_redis.Channel):
    """A kombu Redis channel that reuses one client for its own commands, with broker receipts."""

    QoS = ReceiptQoS


class SentinelChannel(_OwnClient, kombu_redis.SentinelChannel):
    """kombu's Sentinel channel, reusing one client likewise (its pool asks the sentinels), with broker receipts."""

    QoS = ReceiptQoS


class Transport(kombu_redis.Transport):
    Channel = Channel


class SentinelTransport(kombu_redis.SentinelTransport):
    Channel = SentinelChannel


def captures(transport: str | None) -> bool:
    """Whether a Celery app configured with `broker_transport` = `transport` keeps messages in
    `captured_messages` (Sluice's channels) rather than sending them."""
    return transport in (TRANSPORT_PATH, SENTINEL_TRANSPORT_PATH)


def transport_for(broker_url: str) -> str | None:
    """The transport to configure for `broker_url`: Sluice's for redis://, rediss:// and sentinel://,
    else kombu's choice (None)."""
    scheme = urlparse(broker_url).scheme
    return {"redis": TRANSPORT_PATH, "rediss": TRANSPORT_PATH, "sentinel": SENTINEL_TRANSPORT_PATH}.get(scheme)


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
            tags[task_id] = text(tag)
    return tags


def keep_visible(client: Any, task_ids: Iterable[str], now: float) -> int:
    """Restart the visibility clock of the unacknowledged messages of these tasks; how many there were.

    kombu puts a message back on its queue once it has been unacknowledged for the visibility
    timeout, whether or not the task is still running: a batch running longer would run twice.
    A live node calls this for what it holds at every heartbeat, so its messages never look
    abandoned; a dead node stops, and its messages come back (Sluice gives them back sooner,
    see `jobs/nodes/registry.py`). `XX`: a message acknowledged meanwhile is not put back in the index.
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


def queue_lists(channel: Any, queue: str) -> list[str]:
    """The broker's lists holding `queue`'s messages: one per priority level a kombu Redis channel keeps."""
    return [channel._q_for_pri(queue, priority) for priority in getattr(channel, "priority_steps", [0])]


def queue_lengths(channel: Any, queues: Iterable[str]) -> dict[str, int]:
    """Messages waiting in each of `queues` (every priority level of it), read in one round trip."""
    lists = {queue: queue_lists(channel, queue) for queue in queues}
    with channel.conn_or_acquire() as client:
        pipe = client.pipeline(transaction=False)
        for keys in lists.values():
            for key in keys:
                pipe.llen(key)
        lengths = iter(pipe.execute())
    return {queue: sum(next(lengths) for _ in keys) for queue, keys in lists.items()}
