"""A batch the broker lost is run anyway: kombu's Redis transport pops a message with BRPOP and only then
records it as unacknowledged, so a node killed in between takes the message along, and one killed just
after leaves it unacknowledged with nothing to give it back for an hour. Beat looks for each running job's
batches everywhere a batch can be and, when some are nowhere for its grace period, sends them again.
Real kombu messages, real Redis; beat's step is driven with `now`."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import pytest
import redis
from kombu import Consumer, Queue

from beat.lost_batches import LOST_MESSAGE, LostBatchWatch
from foundation.settings import Settings
from jobs.batch.job import Job, JobStatus
from jobs.batch.publish import BatchPublisher
from jobs.celery_app import create_celery
from jobs.services import Services
from jobs.transport.broker import receipt_for
from jobs.transport.delivery import Delivery

NODE = "alive@host"
GRACE = 10.0
T0 = 1_700_000_000.0


@pytest.fixture
def services(redis_server: str, redis_client: redis.Redis) -> Services:
    settings = Settings(redis_url=redis_server.rsplit("/", 1)[0] + "/1", node_ttl_s=5)  # redis_client's clean db
    return Services.connect(settings, create_celery(settings))


def running_job(services: Services, job_id: str, batches: int = 3, keep: bool = True) -> Job:
    """A job whose batches are all published (with their payloads kept) and sealed, as the enqueuer leaves it."""
    job = Job(job_id=job_id, api_name="iris", workers=1, config={}, timeout=None, total_batch_count=batches,
              start_time=time.time(), api_spec={}, bundle="b", hardware_queue="cpu")
    services.store.create(job, JobStatus.RUNNING)
    with BatchPublisher(services.celery, job.job_id, job.queue, services.store if keep else None) as publisher:
        for index in range(batches):
            publisher.batch(index, [f"item-{index}"], None)
    services.store.seal(job.job_id, batches)
    return job


def take_all(services: Services, job: Job) -> list[tuple[str, list[Any]]]:
    """Take every message off the job's queue and keep each unacknowledged, as nodes that took them do."""
    taken: list[tuple[str, list[Any]]] = []
    with services.celery.connection_for_write() as conn:
        channel = conn.default_channel

        def on_message(body: Any, message: Any) -> None:
            taken.append((message.headers["id"], body[0]))

        with Consumer(channel, [Queue(job.queue, routing_key=job.queue)], callbacks=[on_message]):
            try:
                while True:
                    conn.drain_events(timeout=0.5)
            except TimeoutError:
                pass
        channel.do_restore = False  # a node that dies gives nothing back
    return taken


def pop_lost(services: Services, job: Job) -> list[Any]:
    """BRPOP the job's next message and drop it: a node killed before kombu recorded it as unacknowledged."""
    _, raw = services.redis.brpop([job.queue], timeout=1)
    return json.loads(_body(raw))[0]


def _body(raw: bytes) -> bytes:
    return base64.b64decode(json.loads(raw)["body"])


def queued(services: Services, job: Job) -> list[tuple[int, list[Any]]]:
    """(index, payload) of every message in the job's queue, in the order nodes would take them."""
    raws = services.redis.lrange(job.queue, 0, -1)
    return [(args[1], args[2]) for args in (json.loads(_body(raw))[0] for raw in reversed(raws))]


def finish(services: Services, job: Job, task_id: str, index: int) -> None:
    """A node runs and records a batch it took."""
    services.store.begin_batch(job.job_id, index, Delivery(NODE, task_id, receipt_for(task_id)))
    services.store.record_success(job.job_id, index, 0.1, Delivery(NODE, task_id, receipt_for(task_id)))


def test_a_batch_message_the_broker_lost_is_published_again_once_its_grace_is_over(services: Services) -> None:
    job = running_job(services, "job-lost")
    taken = take_all(services, job)
    lost_index = taken[1][1][1]
    for task_id, args in taken:
        if args[1] != lost_index:
            finish(services, job, task_id, args[1])
    services.redis.delete("unacked", "unacked_index")  # the lost one never got there
    watch = LostBatchWatch(GRACE)

    assert watch(services, T0) == []
    assert watch(services, T0 + GRACE - 1) == []
    assert queued(services, job) == []
    assert watch(services, T0 + GRACE) == [job.job_id]

    assert queued(services, job) == [(lost_index, [f"item-{lost_index}"])]
    assert watch(services, T0 + 3 * GRACE) == []  # it is queued now: nothing more is sent


def test_a_batch_popped_by_a_node_killed_at_once_is_run_with_its_own_items(services: Services) -> None:
    job = running_job(services, "job-popped", batches=2)
    args = pop_lost(services, job)
    watch = LostBatchWatch(GRACE)
    # the other batch is taken and run meanwhile: no batch is judged lost while anything is queued or running
    (task_id, other), = take_all(services, job)
    assert watch(services, T0) == []
    services.store.begin_batch(job.job_id, other[1], Delivery(NODE, task_id, receipt_for(task_id)))
    assert watch(services, T0 + GRACE) == []
    services.store.record_success(job.job_id, other[1], 0.1, Delivery(NODE, task_id, receipt_for(task_id)))
    services.redis.delete("unacked", "unacked_index")

    assert watch(services, T0 + 2 * GRACE) == []  # first seen lost now
    assert watch(services, T0 + 3 * GRACE) == [job.job_id]

    assert queued(services, job) == [(args[1], args[2])]


def test_a_batch_left_unacknowledged_by_no_node_goes_back_to_its_queue(services: Services) -> None:
    job = running_job(services, "job-orphan", batches=2)
    taken = take_all(services, job)
    finish(services, job, *next((t, a[1]) for t, a in taken if a[1] == 0))
    orphan_task, orphan_args = next((t, a) for t, a in taken if a[1] == 1)  # its node died before beginning it
    watch = LostBatchWatch(GRACE)

    assert watch(services, T0) == []
    assert watch(services, T0 + GRACE) == [job.job_id]

    assert queued(services, job) == [(1, orphan_args[2])]
    unacked_ids = {json.loads(v)[0]["headers"]["id"] for v in services.redis.hvals("unacked")}
    assert orphan_task not in unacked_ids


def test_a_batch_recorded_during_the_grace_period_starts_the_wait_again(services: Services) -> None:
    job = running_job(services, "job-slow", batches=3)
    taken = take_all(services, job)
    finish(services, job, taken[0][0], taken[0][1][1])
    services.redis.delete("unacked", "unacked_index")
    watch = LostBatchWatch(GRACE)

    assert watch(services, T0) == []
    services.store.record_success(job.job_id, taken[1][1][1], 0.1)  # it was not lost: a slow node recorded it
    assert watch(services, T0 + GRACE) == []
    assert watch(services, T0 + 2 * GRACE - 1) == []
    assert watch(services, T0 + 2 * GRACE) == [job.job_id]
    assert [index for index, _ in queued(services, job)] == [taken[2][1][1]]


def test_nothing_is_sent_while_a_node_runs_a_batch_of_the_job(services: Services) -> None:
    job = running_job(services, "job-busy", batches=2)
    taken = take_all(services, job)
    running = Delivery(NODE, taken[0][0], receipt_for(taken[0][0]))
    services.store.begin_batch(job.job_id, taken[0][1][1], running)  # running, for long
    lost = [tag for tag, raw in services.redis.hgetall("unacked").items()
            if json.loads(raw)[0]["headers"]["id"] == taken[1][0]]
    if lost:  # taken and not begun: a node writes nothing of it before its begin
        services.redis.hdel("unacked", *lost)
    watch = LostBatchWatch(GRACE)

    for tick in range(5):
        assert watch(services, T0 + tick * GRACE) == []
    assert queued(services, job) == []


def test_a_lost_batch_without_a_kept_copy_fails_with_a_clear_message_and_the_job_completes(
    services: Services,
) -> None:
    job = running_job(services, "job-nocopy", batches=2, keep=False)
    taken = take_all(services, job)
    finish(services, job, taken[0][0], taken[0][1][1])
    services.redis.delete("unacked", "unacked_index")
    watch = LostBatchWatch(GRACE)

    watch(services, T0)
    assert watch(services, T0 + GRACE) == [job.job_id]

    failed = services.store.failed_batches(job.job_id)
    assert [(f["index"], f["error"]) for f in failed] == [(taken[1][1][1], LOST_MESSAGE)]
    assert services.store.state(job.job_id).all_recorded
    assert [json.loads(_body(raw))[0] for raw in services.redis.lrange(job.queue, 0, -1)] == [[job.job_id]]


def test_jobs_not_running_are_left_alone(services: Services) -> None:
    job = running_job(services, "job-stopped", batches=1)
    services.redis.delete(job.queue)  # its message lost
    services.store.transition(job.job_id, JobStatus.STOPPED)
    enqueuing = Job(job_id="job-enqueuing", api_name="iris", workers=1, config={}, timeout=None,
                    total_batch_count=0, start_time=time.time(), api_spec={}, bundle="b", hardware_queue="cpu")
    services.store.create(enqueuing, JobStatus.ENQUEUING)
    watch = LostBatchWatch(GRACE)

    assert watch(services, T0) == [] and watch(services, T0 + 2 * GRACE) == []


def test_recording_a_batch_drops_its_kept_payload(services: Services) -> None:
    job = running_job(services, "job-kept", batches=2)

    assert services.store.kept_payloads(job.job_id, [0, 1]) == {0: (["item-0"], None), 1: (["item-1"], None)}
    services.store.record_success(job.job_id, 0, 0.1)
    assert services.store.kept_payloads(job.job_id, [0, 1]) == {1: (["item-1"], None)}
