"""Store calls sent now and answered later (`jobs/store/answers.py`), and answers left to a node's
event loop (`jobs/nodes/loop_answers.py`), against a real redis-server, kombu's real hub and a
real Celery worker on the solo pool.

What the contract tests cannot show: an answer is read from its own socket once Redis ran the
call; a call whose connection broke before it ran, or whose answer was lost after, or whose script
Redis no longer has, or that could not even be sent, is made again and answers what one call
would have; and on a node, a batch's record is used by the loop after its task returned.
"""

from __future__ import annotations

import logging
import select
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from celery.contrib.testing.worker import start_worker
from kombu.asynchronous import Hub

from foundation.redis_clients import connect
from jobs.batch.job import Job, JobStatus
from jobs.nodes.loop_answers import LoopAnswers
from jobs.nodes.worker_node import AnswersOnLoop
from jobs.store import JobStore, Recorded
from jobs.store.answers import SentScript
from jobs.transport.broker import TRANSPORT_PATH
from tests.contracts.job_store import make_job
from tests.integration.redis_process import RedisProcess

CLIENT_NAME = "answers-test"


@pytest.fixture
def client(redis_server: str) -> Iterator[redis.Redis]:
    named = redis.Redis.from_url(redis_server.rsplit("/", 1)[0] + "/1", client_name=CLIENT_NAME)
    named.flushdb()
    yield named
    named.flushdb()


@pytest.fixture
def store(client: redis.Redis) -> JobStore:
    return JobStore(client)


@pytest.fixture
def running(store: JobStore) -> Job:
    job = make_job()
    store.create(job, JobStatus.RUNNING)
    return job


def readable(answer: Any, timeout: float = 5.0) -> bool:
    fd = answer.fileno()
    assert fd is not None, "the call was not sent"
    return bool(select.select([fd], [], [], timeout)[0])


def test_an_answer_arrives_on_its_own_socket_once_redis_ran_the_call(store: JobStore, running: Job) -> None:
    store.begin_batch(running.job_id, 9)  # Redis has the script from here on (a first call loads it)
    sent = store.send_begin_batch(running.job_id, 0)

    assert readable(sent)  # the begin ran: it is counted before anyone reads its answer
    assert store.send_begin_batch(running.job_id, 0).answer().deliveries == 2
    start = sent.answer()
    assert (start.status, start.deliveries, sent.fileno()) == (JobStatus.RUNNING, 1, None)


def test_a_call_whose_connection_broke_before_it_ran_is_made_again_and_counts_once(
    redis_server: str, store: JobStore, client: redis.Redis, running: Job
) -> None:
    store.record_success(running.job_id, 1, 0.5)  # Redis has the script from here on
    admin = redis.Redis.from_url(redis_server)  # unnamed: only the store's connections are named
    admin.execute_command("CLIENT", "PAUSE", 5000, "WRITE")  # the record waits in Redis, unrun
    try:
        sent = store.send_record_success(running.job_id, 0, 1.5)
        assert not readable(sent, timeout=0.2)
        for connection in admin.client_list():
            if connection.get("name") == CLIENT_NAME:
                admin.execute_command("CLIENT", "KILL", "ID", connection["id"])
    finally:
        admin.execute_command("CLIENT", "UNPAUSE")

    assert sent.answer() is Recorded.COUNTED  # made again on a new connection
    state = store.state(running.job_id)
    assert (state.succeeded, state.time_total) == (2, 2.0)


def test_a_call_whose_answer_was_lost_after_it_ran_answers_what_its_first_run_did(
    store: JobStore, running: Job
) -> None:
    store.record_success(running.job_id, 1, 0.5)  # Redis has the script from here on
    store.seal(running.job_id, 2)
    sent = store.send_record_success(running.job_id, 0, 0.5)
    assert readable(sent)  # ran, and completed the job
    sent._connection._sock.close()  # the answer is lost on the way

    assert sent.answer() is Recorded.COMPLETED_JOB  # not DUPLICATE: the same call, made again
    assert store.state(running.job_id).succeeded == 2


def test_a_script_redis_lost_is_loaded_again_when_its_answer_is_read(
    store: JobStore, client: redis.Redis, running: Job
) -> None:
    client.script_flush()  # as after a failover to a replica that never ran it

    start = store.send_begin_batch(running.job_id, 0).answer()

    assert (start.status, start.deliveries) == (JobStatus.RUNNING, 1)


def test_a_call_that_could_not_be_sent_is_made_when_its_answer_is_asked_for(tmp_path: Path) -> None:
    server = RedisProcess(tmp_path / "redis").start()
    try:
        store = JobStore(connect(server.url, retry_s=0.3))
        job = make_job()
        store.create(job, JobStatus.RUNNING)
        server.kill()
        sent = store.send_record_success(job.job_id, 0, 0.5)  # Redis is down: nothing is sent
        assert sent.fileno() is None
        threading.Timer(0.5, server.restart).start()

        assert sent.answer() is Recorded.COUNTED  # waits for Redis, then records
        assert store.state(job.job_id).succeeded == 1
    finally:
        server.close()


def turn_until(hub: Hub, done: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:
        hub.run_once()
    assert done(), "the loop never used the answer"


def test_an_answer_left_to_the_loop_is_used_when_the_loop_sees_it_arrive(store: JobStore, running: Job) -> None:
    hub, loop, used = Hub(), LoopAnswers(), []
    loop.attach(hub)
    store.seal(running.job_id, 1)

    assert loop.later(store.send_record_success(running.job_id, 0, 0.5), used.append)
    assert used == [] and loop.pending == 1  # nothing read yet
    turn_until(hub, lambda: used)

    assert used == [Recorded.COMPLETED_JOB] and loop.pending == 0
    hub.close()


def test_an_answer_is_not_left_off_the_loops_thread_nor_before_a_loop_is_attached(
    store: JobStore, running: Job
) -> None:
    loop, hub = LoopAnswers(), Hub()
    unattached = store.send_record_success(running.job_id, 0, 0.5)
    assert not loop.later(unattached, print)
    assert unattached.answer() is Recorded.COUNTED

    loop.attach(hub)
    elsewhere = store.send_record_success(running.job_id, 1, 0.5)
    left: list[bool] = []
    thread = threading.Thread(target=lambda: left.append(loop.later(elsewhere, print)))
    thread.start()
    thread.join()
    assert left == [False] and loop.pending == 0
    assert elsewhere.answer() is Recorded.COUNTED
    hub.close()


def test_settling_uses_every_pending_answer_oldest_first_without_the_loop_turning(
    store: JobStore, running: Job
) -> None:
    hub, loop, used = Hub(), LoopAnswers(), []
    loop.attach(hub)
    store.seal(running.job_id, 3)
    for index in range(3):
        assert loop.later(store.send_record_success(running.job_id, index, 0.5),
                          lambda recorded, index=index: used.append((index, recorded)))

    loop.settle()

    assert used == [(0, Recorded.COUNTED), (1, Recorded.COUNTED), (2, Recorded.COMPLETED_JOB)]
    assert loop.pending == 0
    hub.close()


def test_a_use_that_fails_is_logged_and_the_loop_and_the_next_answers_go_on(
    store: JobStore, running: Job, caplog: pytest.LogCaptureFixture
) -> None:
    hub, loop, used = Hub(), LoopAnswers(), []
    loop.attach(hub)

    def fails(recorded: Recorded) -> None:
        raise RuntimeError("sending the completion failed")

    loop.later(store.send_record_success(running.job_id, 0, 0.5), fails)
    loop.later(store.send_record_success(running.job_id, 1, 0.5), used.append)
    with caplog.at_level(logging.ERROR, logger="jobs.nodes.loop_answers"):
        turn_until(hub, lambda: used)

    assert used == [Recorded.COUNTED]
    assert "using a store answer failed" in caplog.text and "sending the completion failed" in caplog.text
    assert store.state(running.job_id).succeeded == 2
    hub.close()


def test_a_solo_nodes_task_leaves_its_record_to_the_nodes_loop_which_uses_it_after_the_task_returned(
    redis_server: str, store: JobStore, running: Job
) -> None:
    """A real Celery worker on the solo pool, with Sluice's consumer step attaching its event loop."""
    loop = LoopAnswers()

    class _AnswersOnThisLoop(AnswersOnLoop):
        def __init__(self, parent: Any, **kwargs: Any) -> None:
            super().__init__(parent, answers=loop, **kwargs)

    app = Celery("answers-test", broker=redis_server, set_as_current=False)
    app.conf.update(broker_transport=TRANSPORT_PATH, worker_pool="solo", task_acks_late=True,
                    worker_prefetch_multiplier=1, worker_hijack_root_logger=False)
    app.steps["consumer"].add(_AnswersOnThisLoop)
    events: list[tuple[str, Any]] = []
    done = threading.Event()
    store.seal(running.job_id, 2)

    def record(index: int) -> None:
        def use(recorded: Recorded) -> None:
            events.append(("used", (index, recorded)))
            if recorded is Recorded.COMPLETED_JOB:
                done.set()

        loop.settle()  # as the runtime does first: nothing is left pending behind a task
        sent = store.send_record_success(running.job_id, index, 0.5)
        events.append(("left", loop.later(sent, use)))
        events.append(("returned", index))

    app.task(name="answers-test.record", shared=False)(record)
    with start_worker(app, pool="solo", perform_ping_check=False, loglevel="WARNING"):
        for index in range(2):
            app.send_task("answers-test.record", args=(index,))
        assert done.wait(20), events

    assert events[:3] == [("left", True), ("returned", 0), ("used", (0, Recorded.COUNTED))]
    assert events[3:] == [("left", True), ("returned", 1), ("used", (1, Recorded.COMPLETED_JOB))]
    assert loop.pending == 0


def test_a_sent_script_is_a_single_evalsha_on_its_own_connection(client: redis.Redis, store: JobStore,
                                                                  running: Job) -> None:
    before = client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
    sent = store.send_begin_batch(running.job_id, 0)
    assert isinstance(sent, SentScript)
    sent.answer()
    assert client.info("commandstats")["cmdstat_evalsha"]["calls"] == before + 1
