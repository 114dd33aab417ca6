"""kombu's layout of an unacknowledged message, as Sluice's own scripts write it.

A batch's begin script writes its message into kombu's unacknowledged hash and index, and its record
script takes it out (`jobs/transport/broker.py`, `jobs/store/lua/`), where kombu's Redis channel would
write and remove it itself. So Sluice depends on how kombu lays those out: if a kombu release moved
them (another key, another encoding, another index), a dead node's batch would never be given back,
or given back twice. Here the same message is taken once through kombu's own channel and once
through Sluice's, and what each leaves in Redis is compared key by key; then kombu's own restore is
asked to give back what Sluice wrote. An upgrade of kombu that changes any of it fails here, by name.
(pyproject.toml bounds kombu below its next minor release; docs/dependencies.md says how to take one.)
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from kombu import Connection, Queue

from jobs.store.ledger import RedisBatchLedger
from jobs.tasks import RUN_BATCH
from jobs.transport.broker import TRANSPORT_PATH, receipt_for
from jobs.transport.delivery import BROKER_UNACKED, BROKER_UNACKED_INDEX, Delivery

pytestmark = pytest.mark.integration

QUEUE = "layout.job"
TASK_ID = "task-layout"


@pytest.fixture
def layout_url(redis_server: str) -> str:
    """A database of its own, emptied, so that every key in it is one this test's broker wrote."""
    url = redis_server.rsplit("/", 1)[0] + "/13"
    redis.Redis.from_url(url).flushdb()
    return url


def normalised(client: redis.Redis, now: float) -> dict[str, Any]:
    """Every key of the database: its type and value, with delivery tags and times made comparable."""
    kept: dict[str, Any] = {}
    for raw_key in client.keys("*"):
        key = raw_key.decode()
        kind = client.type(key).decode()
        if kind == "hash":
            entries = client.hgetall(key)
            value: Any = sorted(json.dumps(without_tag(json.loads(raw)), sort_keys=True) for raw in entries.values())
        elif kind == "zset":
            value = [("TAG", "a time of taking" if abs(score - now) < 60 else score)
                     for _, score in client.zrange(key, 0, -1, withscores=True)]
        elif kind == "list":
            value = [json.dumps(without_tag(json.loads(raw)), sort_keys=True) for raw in client.lrange(key, 0, -1)]
        elif kind == "set":
            value = sorted(member.decode() for member in client.smembers(key))
        else:
            value = client.get(key)
        kept[key] = (kind, value)
    return kept


def without_tag(value: Any) -> Any:
    """A message (or an unacknowledged entry holding one) with its delivery tag, unique to each take, masked."""
    message = value[0] if isinstance(value, list) else value
    message["properties"]["delivery_tag"] = "TAG"
    return value


def take_and_settle(url: str, transport: str | None, begin: Callable[[Any], None],
                    record: Callable[[Any], None]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Publish a batch message, take it, begin and record it; Redis as it is after the take, the begin and the ack."""
    client = redis.Redis.from_url(url)
    with Connection(url, transport=transport) as connection:
        simple = connection.SimpleQueue(Queue(QUEUE, routing_key=QUEUE))
        simple.consumer.qos(prefetch_count=1)
        simple.put({"args": ["job-layout", 0]}, headers={"task": RUN_BATCH, "id": TASK_ID})
        message = simple.get(timeout=5)
        taken = normalised(client, time.time())
        begin(message)
        begun = normalised(client, time.time())
        record(message)
        message.ack()
        acknowledged = normalised(client, time.time())
        simple.close()
    client.flushdb()
    return taken, begun, acknowledged


def sluices_receipt(url: str) -> tuple[Callable[[Any], None], Callable[[Any], None]]:
    """What a Sluice node does with a batch message: its begin script writes the entry, its record removes it."""
    ledger = RedisBatchLedger(redis.Redis.from_url(url))
    deliveries: list[Delivery] = []

    def begin(_message: Any) -> None:
        deliveries.append(Delivery("node-layout", TASK_ID, receipt_for(TASK_ID)))
        ledger.begin_batch("job-layout", 0, deliveries[0])

    def record(_message: Any) -> None:
        ledger.record_success("job-layout", 0, 0.01, deliveries[0])

    return begin, record


def only_kombus(state: dict[str, Any], kombus_keys: set[str]) -> dict[str, Any]:
    """The keys kombu writes (the job store's own keys, which the begin also writes, left out)."""
    return {key: value for key, value in state.items() if key in kombus_keys}


def test_a_batchs_begin_and_record_leave_redis_as_kombus_own_channel_leaves_it(layout_url: str) -> None:
    kombu_taken, _, kombu_acknowledged = take_and_settle(layout_url, None, lambda m: None, lambda m: None)
    begin, record = sluices_receipt(layout_url)
    sluice_taken, sluice_begun, sluice_acknowledged = take_and_settle(layout_url, TRANSPORT_PATH, begin, record)

    # kombu writes the message into its hash and the time taken into its index; nothing else.
    assert kombu_taken[BROKER_UNACKED][0] == "hash" and kombu_taken[BROKER_UNACKED_INDEX][0] == "zset", (
        f"kombu no longer keeps a taken message as Sluice's scripts write it: {sorted(kombu_taken)}")
    kombus_keys = set(kombu_taken) | set(kombu_acknowledged)
    # Sluice's transport leaves the write to the batch's begin: between the take and the begin, nothing.
    assert BROKER_UNACKED not in sluice_taken
    # After the begin, every key kombu's take writes is there, with the same value.
    assert only_kombus(sluice_begun, kombus_keys) == kombu_taken
    # After the record, every key kombu's acknowledgement leaves is as kombu leaves it.
    assert only_kombus(sluice_acknowledged, kombus_keys) == kombu_acknowledged


def test_kombus_own_restore_gives_back_a_message_whose_entry_sluices_begin_wrote(layout_url: str) -> None:
    client = redis.Redis.from_url(layout_url)
    begin, _ = sluices_receipt(layout_url)
    with Connection(layout_url, transport=TRANSPORT_PATH) as connection:
        simple = connection.SimpleQueue(Queue(QUEUE, routing_key=QUEUE))
        simple.consumer.qos(prefetch_count=1)
        simple.put({"args": ["job-layout", 0]}, headers={"task": RUN_BATCH, "id": TASK_ID})
        begin(simple.get(timeout=5))
        connection.default_channel.do_restore = False  # the node dies: nothing recorded, acknowledged or put back
    assert client.llen(QUEUE) == 0

    # kombu's own channel, as any node's, restores what has been unacknowledged past its visibility
    # timeout (a negative one makes what was taken a moment ago old enough).
    options = {"visibility_timeout": -60}
    with Connection(layout_url, transport_options=options) as connection:
        connection.default_channel.qos.restore_visible(num=100)
        again = connection.SimpleQueue(Queue(QUEUE, routing_key=QUEUE)).get(timeout=5)
        held = client.hlen(BROKER_UNACKED)

    assert again.payload == {"args": ["job-layout", 0]}
    assert again.headers["task"] == RUN_BATCH and again.headers["id"] == TASK_ID
    assert held == 1  # taken again: held by kombu's consumer now, in kombu's own entry
