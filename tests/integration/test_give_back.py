"""A node that dies mid-batch: its unacknowledged batch goes back to its queue at once, not after
Redis's visibility timeout. The node here is a real process that takes a real batch message
through kombu, enters it in flight the way a worker does, and is SIGKILLed. (Which deliveries go
back, with the in-memory fakes: tests/unit/test_placement.py.)"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from types import SimpleNamespace

import pytest
import redis
from kombu import Consumer, Queue

from foundation.settings import Settings
from jobs.batch.job import Job, JobStatus
from jobs.batch.publish import BatchPublisher
from jobs.celery_app import create_celery
from jobs.nodes.registry import GIVE_BACK_AFTER_TTLS
from jobs.nodes.worker_node import SettleOnConnect
from jobs.services import Services
from jobs.transport.delivery import Delivery
from jobs.transport.settle import give_back

from ..conftest import ROOT

DEAD_NODE = "dead@host"

# Takes one message off the job queue, enters it in flight as a worker does, then dies unacknowledged.
TAKE_ONE_AND_DIE = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {root!r})
    from kombu import Consumer, Queue
    from jobs.celery_app import create_celery
    from foundation.settings import Settings
    from jobs.transport.broker import receipt_for
    from jobs.transport.delivery import Delivery
    from jobs.wiring import init_services

    settings = Settings(redis_url={url!r})
    app = create_celery(settings)
    services = init_services(app, settings)

    def take(body, message):
        (job_id, index, payload, ref), _, _ = body
        task_id = message.headers["id"]
        services.store.begin_batch(job_id, index, Delivery({node!r}, task_id, receipt_for(task_id)))
        print(index, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    with app.connection_for_write() as conn:
        with Consumer(conn, [Queue({queue!r}, routing_key={queue!r})], callbacks=[take], prefetch_count=1):
            conn.drain_events(timeout=10)
""")


@pytest.fixture
def services(redis_server: str, redis_client: redis.Redis) -> Services:
    settings = Settings(redis_url=redis_server.rsplit("/", 1)[0] + "/1", node_ttl_s=5)  # redis_client's clean db
    return Services.connect(settings, create_celery(settings))


def running_job(services: Services, job_id: str) -> Job:
    job = Job(job_id=job_id, api_name="iris", workers=1, config={}, timeout=None, total_batch_count=3,
              start_time=time.time(), api_spec={}, bundle="b", hardware_queue="cpu")
    services.store.create(job, JobStatus.RUNNING)
    with BatchPublisher(services.celery, job.job_id, job.queue) as publisher:
        for index in range(3):
            publisher.batch(index, [index], None)
    return job


def kill_a_node_holding_one_batch(services: Services, job: Job) -> int:
    script = TAKE_ONE_AND_DIE.format(root=str(ROOT), url=services.settings.redis_url, node=DEAD_NODE, queue=job.queue)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == -9, done.stderr
    return int(done.stdout.split()[0])


def queued_indexes(services: Services, job: Job) -> list[int]:
    """Every batch index left in the job queue, in the order workers would take them."""
    taken: list[int] = []
    with services.celery.connection_for_write() as conn:
        def on_message(body, message):
            taken.append(body[0][1])
            message.ack()

        with Consumer(conn, [Queue(job.queue, routing_key=job.queue)], callbacks=[on_message], prefetch_count=1):
            try:
                while True:
                    conn.drain_events(timeout=0.5)
            except TimeoutError:
                pass
    return taken


@pytest.mark.parametrize("last_heartbeat_ttls_ago", [None, GIVE_BACK_AFTER_TTLS + 1])
def test_beat_gives_a_dead_nodes_batch_back_to_the_head_of_its_queue(services, last_heartbeat_ttls_ago):
    job = running_job(services, "job-a")
    held = kill_a_node_holding_one_batch(services, job)
    assert list(services.nodes.inflight(DEAD_NODE).values()) == [f"job-a:{held}"]
    now = time.time()
    if last_heartbeat_ttls_ago is not None:
        services.nodes.heartbeat(DEAD_NODE, ["cpu"], now - last_heartbeat_ttls_ago * services.settings.node_ttl_s)

    services.placement.reconcile(now)

    assert services.nodes.inflight(DEAD_NODE) == {}
    remaining = queued_indexes(services, job)
    assert remaining[0] == held and sorted(remaining) == [0, 1, 2]


@pytest.mark.parametrize("last_heartbeat_ttls_ago", [0, GIVE_BACK_AFTER_TTLS - 1])
def test_a_node_silent_for_less_than_the_give_back_time_keeps_its_batch(services, last_heartbeat_ttls_ago):
    job = running_job(services, "job-b")
    held = kill_a_node_holding_one_batch(services, job)
    now = time.time()  # maybe only slow: a predictor holding the GIL stops the heartbeat thread too
    services.nodes.heartbeat(DEAD_NODE, ["cpu"], now - last_heartbeat_ttls_ago * services.settings.node_ttl_s)

    services.placement.reconcile(now)

    assert list(services.nodes.inflight(DEAD_NODE).values()) == [f"job-b:{held}"]
    assert held not in queued_indexes(services, job)


def test_a_restarted_node_gives_back_what_its_previous_life_held_before_it_consumes(services):
    job = running_job(services, "job-c")
    held = kill_a_node_holding_one_batch(services, job)
    step = SettleOnConnect(SimpleNamespace(), services=lambda: services)

    step.start(SimpleNamespace(app=services.celery, hostname=DEAD_NODE))  # the new life's consumer connecting

    assert services.nodes.inflight(DEAD_NODE) == {}
    assert queued_indexes(services, job)[0] == held


def test_a_batch_of_a_job_that_ended_meanwhile_is_dropped_with_its_queue(services):
    job = running_job(services, "job-d")
    kill_a_node_holding_one_batch(services, job)
    services.store.transition(job.job_id, JobStatus.STOPPED)

    assert give_back(DEAD_NODE, services.nodes, services.store, services.queues) == 1

    assert queued_indexes(services, job) == []
    assert services.nodes.inflight(DEAD_NODE) == {}


def test_a_recorded_batch_leaves_no_in_flight_entry(services):
    job = running_job(services, "job-e")
    delivery = Delivery("busy@host", "task-1")

    services.store.begin_batch(job.job_id, 0, delivery)
    assert services.nodes.inflight("busy@host") == {"task-1": "job-e:0"}
    services.store.record_success(job.job_id, 0, 0.1, delivery)

    assert services.nodes.inflight("busy@host") == {}
