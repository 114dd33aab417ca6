"""An AsyncAPI request whose task message went missing is run anyway: the API process that stored it died
before sending its task, or a node took the message off the queue and died before taking the request.
Beat sends a new message for each request that stays unstarted past the messages left on its queue for
its grace period, and never for one whose message still waits. Real Celery messages, real Redis; beat's
step is driven with `now`."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import pytest
import redis
from kombu import Consumer, Queue

from beat.lost_requests import LostRequestWatch
from foundation.api_registry import RedisApiRegistry
from foundation.settings import Settings
from jobs.asyncapi.request import RequestStatus
from jobs.asyncapi.submit import Submission, submit_request
from jobs.celery_app import create_celery
from jobs.placement.asyncapi import async_queue
from jobs.services import Services
from jobs.tasks import RUN_ASYNC
from predictors_runtime.config import ApiConfig

GRACE = 10.0
T0 = 1_700_000_000.0
QUEUE = async_queue("echo")


@pytest.fixture
def services(redis_server: str, redis_client: redis.Redis, tmp_path: Any) -> Services:
    settings = Settings(redis_url=redis_server.rsplit("/", 1)[0] + "/1",  # redis_client's clean db
                        storage=str(tmp_path / "storage"))
    services = Services.connect(settings, create_celery(settings))
    RedisApiRegistry(services.redis).put(
        ApiConfig.model_validate({"name": "echo", "kind": "AsyncAPI", "predictor": {"path": "p.py"}}), "b", now=T0)
    return services


def submit(services: Services, body: bytes = b'{"n": 1}') -> str:
    """POST /echo as the API process does it: the request stored with its task message in one step."""
    return submit_request(services.async_requests, services.request_objects, services.celery,
                          Submission("echo", body, "application/json"), time.time(), services.task_messages)


def queued(services: Services) -> list[tuple[str, Any]]:
    """(task name, args) of the messages on the API's queue, in the order nodes take them."""
    found = []
    for raw in reversed(services.redis.lrange(QUEUE, 0, -1)):
        message = json.loads(raw)
        found.append((message["headers"]["task"], json.loads(base64.b64decode(message["body"]))[0]))
    return found


def take_next(services: Services) -> str:
    """A node takes the queue's next message and dies before taking its request: the message stays in
    kombu's unacknowledged hash (until the visibility timeout) with nothing to give it back."""
    taken: list[str] = []
    with services.celery.connection_for_write() as conn:
        channel = conn.default_channel
        with Consumer(channel, [Queue(QUEUE, routing_key=QUEUE)], callbacks=[lambda body, m: taken.append(body[0][1])],
                      prefetch_count=1):
            conn.drain_events(timeout=2)
        channel.do_restore = False  # a node that dies gives nothing back
    return taken[0]


def test_a_request_whose_message_a_dying_node_took_is_sent_again_once_its_grace_is_over(services: Services) -> None:
    first, second = submit(services), submit(services)
    assert take_next(services) == first
    watch = LostRequestWatch(GRACE)

    assert watch(services, T0) == []
    assert watch(services, T0 + GRACE - 1) == []
    assert queued(services) == [(RUN_ASYNC, ["echo", second])]
    assert watch(services, T0 + GRACE) == [f"echo/{first}"]

    assert queued(services) == [(RUN_ASYNC, ["echo", second]), (RUN_ASYNC, ["echo", first])]
    assert watch(services, T0 + 3 * GRACE) == []  # both have a message on the queue now
    assert services.async_requests.get("echo", first).status is RequestStatus.IN_QUEUE  # type: ignore[union-attr]


def test_a_request_whose_message_was_never_sent_is_sent(services: Services) -> None:
    # The API process stored the request, then died before its task went out (a large payload's path).
    request_id = submit(services)
    services.redis.delete(QUEUE)
    watch = LostRequestWatch(GRACE)
    assert watch(services, T0) == []
    assert watch(services, T0 + GRACE) == [f"echo/{request_id}"]
    assert queued(services) == [(RUN_ASYNC, ["echo", request_id])]


def test_requests_whose_messages_wait_on_their_queue_are_never_sent_again(services: Services) -> None:
    # No node serves the API (scaled to zero, or all busy): every message waits, however long.
    ids = [submit(services) for _ in range(3)]
    watch = LostRequestWatch(GRACE)
    for look in range(5):
        assert watch(services, T0 + look * GRACE) == []
    assert queued(services) == [(RUN_ASYNC, ["echo", request_id]) for request_id in ids]


def test_a_request_a_node_took_or_that_ended_is_never_sent_again(services: Services) -> None:
    running, ended = submit(services), submit(services)
    services.redis.delete(QUEUE)  # both messages taken by nodes
    services.async_requests.begin("echo", running, time.time(), owner="task-1", node="alive@host")
    services.async_requests.finish("echo", ended, RequestStatus.FAILED, time.time(), message="it raised")
    watch = LostRequestWatch(GRACE)
    assert watch(services, T0) == [] and watch(services, T0 + 2 * GRACE) == []
    assert queued(services) == []


def test_a_request_still_lost_after_it_was_sent_again_is_sent_again_one_grace_later(services: Services) -> None:
    request_id = submit(services)
    services.redis.delete(QUEUE)
    watch = LostRequestWatch(GRACE)
    watch(services, T0)
    assert watch(services, T0 + GRACE) == [f"echo/{request_id}"]
    services.redis.delete(QUEUE)  # lost again
    assert watch(services, T0 + GRACE + 1) == []
    assert watch(services, T0 + 2 * GRACE) == [f"echo/{request_id}"]

