"""A node whose connection to Redis broke settles what it held once it reconnects: a batch whose outcome
is recorded is acknowledged, any other goes back to the head of its queue, instead of both waiting in
kombu's unacknowledged hash for Redis's visibility timeout (an hour). Real kombu messages, real Redis.
(Which deliveries are acknowledged and which go back, with the in-memory fakes: tests/unit/test_placement.py.)"""

from __future__ import annotations

import json
import time
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from kombu import Consumer, Queue

from foundation.settings import Settings
from jobs.batch.job import Job, JobStatus
from jobs.batch.publish import BatchPublisher, send_completion
from jobs.celery_app import create_celery
from jobs.nodes.worker_node import SettleOnConnect
from jobs.services import Services
from jobs.transport.broker import receipt_for
from jobs.transport.delivery import COMPLETION_ENTRY, Delivery, inflight_entry
from jobs.transport.settle import Settled, settle_deliveries

NODE = "alive@host"


@pytest.fixture
def services(redis_server: str, redis_client: redis.Redis) -> Services:
    settings = Settings(redis_url=redis_server.rsplit("/", 1)[0] + "/1", node_ttl_s=5)  # redis_client's clean db
    return Services.connect(settings, create_celery(settings))


def running_job(services: Services, job_id: str, batches: int = 3) -> Job:
    job = Job(job_id=job_id, api_name="iris", workers=1, config={}, timeout=None, total_batch_count=batches,
              start_time=time.time(), api_spec={}, bundle="b", hardware_queue="cpu")
    services.store.create(job, JobStatus.RUNNING)
    with BatchPublisher(services.celery, job.job_id, job.queue) as publisher:
        for index in range(batches):
            publisher.batch(index, [index], None)
    return job


def take_one(services: Services, job: Job) -> tuple[str, Any]:
    """Take the next message off the job's queue and keep it unacknowledged, as a node running it does
    when its connection breaks (the channel is dropped without giving it back)."""
    taken: list[tuple[str, Any]] = []
    with services.celery.connection_for_write() as conn:
        channel = conn.default_channel

        def on_message(body: Any, message: Any) -> None:
            taken.append((message.headers["id"], body))

        with Consumer(channel, [Queue(job.queue, routing_key=job.queue)], callbacks=[on_message], prefetch_count=1):
            conn.drain_events(timeout=5)
        channel.do_restore = False  # a broken connection gives nothing back
    task_id, body = taken[0]
    return task_id, body


def settle(services: Services, node: str, running: set[str] | None = None) -> Settled:
    """What a node's consumer does as it (re)connects (`SettleOnConnect`), with the tasks it runs."""
    return settle_deliveries(node, services.nodes, services.store, services.store, services.queues,
                             running or frozenset())


def unacked_task_ids(services: Services) -> set[str]:
    raw = services.redis.hgetall("unacked")
    return {json.loads(value)[0]["headers"]["id"] for value in raw.values()}


def queued_indexes(services: Services, job: Job) -> list[int]:
    taken: list[int] = []
    with services.celery.connection_for_write() as conn:
        def on_message(body: Any, message: Any) -> None:
            taken.append(body[0][1])
            message.ack()

        with Consumer(conn, [Queue(job.queue, routing_key=job.queue)], callbacks=[on_message], prefetch_count=1):
            try:
                while True:
                    conn.drain_events(timeout=0.5)
            except TimeoutError:
                pass
    return taken


def test_a_held_batch_whose_outcome_was_recorded_is_acknowledged_not_run_again(services: Services) -> None:
    job = running_job(services, "job-a")
    task_id, body = take_one(services, job)
    index = body[0][1]
    services.store.begin_batch(job.job_id, index, Delivery(NODE, task_id, receipt_for(task_id)))
    services.store.record_success(job.job_id, index, 0.1)  # recorded elsewhere (its entry stays); not acknowledged

    settled = settle(services, NODE)

    assert settled.acknowledged == [task_id] and settled.given_back == 0
    assert task_id not in unacked_task_ids(services)
    assert sorted(queued_indexes(services, job)) == sorted({0, 1, 2} - {index})
    assert services.nodes.inflight(NODE) == {}


def test_a_held_batch_not_recorded_goes_back_to_the_head_of_its_queue(services: Services) -> None:
    job = running_job(services, "job-b")
    task_id, body = take_one(services, job)
    index = body[0][1]
    # Begun as a node begins it (its broker receipt written), its recording failed with Redis.
    services.store.begin_batch(job.job_id, index, Delivery(NODE, task_id, receipt_for(task_id)))

    settled = settle(services, NODE)

    assert settled.acknowledged == [] and settled.given_back == 1
    remaining = queued_indexes(services, job)
    assert remaining[0] == index and sorted(remaining) == [0, 1, 2]
    assert services.nodes.inflight(NODE) == {}


def test_the_completion_of_a_job_that_ended_is_acknowledged_and_one_still_due_is_given_back(
    services: Services,
) -> None:
    ended = running_job(services, "job-ended", batches=0)
    due = running_job(services, "job-due", batches=0)
    for job in (ended, due):
        send_completion(services.celery, job.job_id, job.queue)
    held = {job.job_id: take_one(services, job)[0] for job in (ended, due)}
    for job_id, task_id in held.items():
        services.nodes.begin_delivery(Delivery(NODE, task_id), inflight_entry(job_id, COMPLETION_ENTRY))
    services.store.transition("job-ended", JobStatus.SUCCEEDED)

    settled = settle(services, NODE)

    assert settled.acknowledged == [held["job-ended"]] and settled.given_back == 1
    assert unacked_task_ids(services) == set()
    assert len(queued_task_names(services, due)) == 1


def queued_task_names(services: Services, job: Job) -> list[str]:
    taken: list[str] = []
    with services.celery.connection_for_write() as conn:
        def on_message(body: Any, message: Any) -> None:
            taken.append(message.headers["task"])
            message.ack()

        with Consumer(conn, [Queue(job.queue, routing_key=job.queue)], callbacks=[on_message], prefetch_count=1):
            try:
                while True:
                    conn.drain_events(timeout=0.5)
            except TimeoutError:
                pass
    return taken


def test_a_task_the_node_is_running_is_left_alone(services: Services) -> None:
    job = running_job(services, "job-c")
    task_id, body = take_one(services, job)
    services.store.begin_batch(job.job_id, body[0][1], Delivery(NODE, task_id, receipt_for(task_id)))

    settled = settle(services, NODE, running={task_id})

    assert settled.acknowledged == [] and settled.given_back == 0
    assert list(services.nodes.inflight(NODE)) == [task_id]
    assert task_id in unacked_task_ids(services)


def test_a_node_holding_nothing_settles_nothing(services: Services) -> None:
    assert settle(services, NODE).given_back == 0


def test_the_node_settles_each_time_its_consumer_connects(services: Services) -> None:
    job = running_job(services, "job-d")
    task_id, body = take_one(services, job)
    services.store.begin_batch(job.job_id, body[0][1], Delivery(NODE, task_id, receipt_for(task_id)))
    step = SettleOnConnect(SimpleNamespace(), services=lambda: services)

    step.start(SimpleNamespace(app=services.celery, hostname=NODE))  # what Celery does on every (re)connect

    assert services.nodes.inflight(NODE) == {}
    assert sorted(queued_indexes(services, job)) == [0, 1, 2]
