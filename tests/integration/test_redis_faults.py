"""Redis stalls (SIGSTOP/SIGCONT) and restarts (SIGKILL, then redis-server again on its append-only
file) while jobs enqueue, run and complete: no job is stranded, none fails for it, no item runs twice.

Each stack here has a Redis of its own, which the tests stop, kill and restart.
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis
from kombu import Consumer, Queue

from foundation.settings import Settings
from jobs.batch.job import Job, JobStatus, new_job_id
from jobs.batch.publish import BatchPublisher
from jobs.celery_app import create_celery
from jobs.nodes.registry import Delivery
from jobs.services import Services
from jobs.store import JobStore, Recorded
from jobs.transport.broker import receipt_for
from sluice.client import Client, ClientError
from sluice.embedded import Stack, free_port
from testbed.waiting import wait_for as _wait_for

from .conftest import FAST_LOOPS, ROOM, closing_client, read_events, write_project
from .redis_process import FAULTS_PREDICTOR, RedisProcess, read_marker

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# Longer than the socket timeout of Sluice's Redis clients (5 s, foundation/redis_clients.py) by a
# second, and no more: a reply is lost, the command still runs.
STALL_S = 6.0
# A Redis restart: killed, then started again on its append-only file this much later; long enough
# that every process meets the dead Redis (nodes poll every 0.1 s, heartbeat every 0.5 s).
DOWN_S = 1.0
# The enqueuer's silence after which beat fails a job is kept at its default: above the retry window.
ENV = {**FAST_LOOPS, "SLUICE_ENQUEUE_STALE_AFTER": "60"}



def wait_job(client: Client, api: str, job_id: str, timeout: float) -> dict[str, Any]:
    """The job's final status. The API shares the stalled Redis: an answer it could not give (5xx)
    is asked again, so what fails a test is the job not ending, not the poll."""
    last: Any = None

    def ended() -> dict[str, Any] | None:
        nonlocal last
        try:
            last = client.job(api, job_id)
        except ClientError as e:
            if 0 < e.http_status < 500:
                raise
            last = e
            return None
        return last if last["status"] not in ("status_enqueuing", "status_running") else None

    try:
        return _wait_for(ended, timeout, f"job {job_id} to end")
    except AssertionError as e:
        raise AssertionError(f"job {job_id} did not end within {timeout:.0f}s; last seen: {last}") from e


@contextmanager
def stall_once_a_job_enqueues(redis_process: RedisProcess, seconds: float, after: float = 0.5) -> Iterator[None]:
    """Stall Redis `after` seconds into a job's `status_enqueuing` (its input being cut), while the block runs.

    Not at once: publishing through kombu waits for a stalled Redis however long it takes, so a
    stall that begins before the enqueuer's first publish is ridden out whatever Sluice does.
    """
    store = JobStore(redis.Redis.from_url(redis_process.url))
    stalled = threading.Event()

    def watch() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if any(status is JobStatus.ENQUEUING for status in store.statuses(store.active_ids()).values()):
                time.sleep(after)
                redis_process.stall(seconds)
                stalled.set()
                return
            time.sleep(0.005)

    watcher = threading.Thread(target=watch, name="stall-when-enqueuing")
    watcher.start()
    try:
        yield
    finally:
        watcher.join()
    assert stalled.is_set(), "no job was seen enqueueing"


def _running_stack(redis_process: RedisProcess, data_dir: Path, roots: Path, workers: int, **env: str) -> Stack:
    environment = {**ENV, "SLUICE_LOCAL_INPUT_ROOTS": str(roots), **env}
    return Stack(port=free_port(), offers=ROOM, workers=workers, redis_url=redis_process.url, data_dir=data_dir,
                 env=environment)


@pytest.fixture(scope="module")
def redis_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    process = RedisProcess(tmp_path_factory.mktemp("faults-redis")).start()
    yield process
    process.close()


@pytest.fixture(scope="module")
def stack(redis_process: RedisProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Two nodes, beat and the API, with Sluice's default Redis retry window (30 s)."""
    data_dir = tmp_path_factory.mktemp("faults-stack")
    with _running_stack(redis_process, data_dir, tmp_path_factory.getbasetemp(), workers=2) as running:
        yield running
        redis_process.resume()
        print(running.logs())


@pytest.fixture(scope="module")
def client(stack: Stack) -> Client:
    return closing_client(stack.url, timeout=120)


@pytest.fixture
def deploy(client: Client, tmp_path: Path) -> Callable[[], str]:
    def deploy_api() -> str:
        name = f"faults-{uuid.uuid4().hex[:8]}"
        client.deploy(write_project(tmp_path / name, name, source=FAULTS_PREDICTOR))
        return name

    return deploy_api


@pytest.fixture
def events_file(tmp_path: Path) -> Path:
    return tmp_path / "events.jsonl"


def _items_done(events: list[dict[str, Any]]) -> Counter[Any]:
    """How often each item finished a predict call (a batch killed mid-call never logs `done`)."""
    counts: Counter[Any] = Counter()
    for event in events:
        if event["event"] == "done":
            counts.update(event["items"] if event["items"] is not None else range(event["first"], event["last"] + 1))
    return counts


def _spans_done(events: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """The (first, last) items of every finished predict call, in order: for inputs too big to list."""
    return sorted((event["first"], event["last"]) for event in events if event["event"] == "done")


def _completions(events: list[dict[str, Any]], job_id: str | None = None) -> int:
    return sum(1 for event in events if event["event"] == "complete" and job_id in (None, event["job_id"]))


# -- fault 1: a stall while the last batch is recorded ---------------------------------------------
def test_a_redis_stall_while_the_last_batch_is_recorded_does_not_strand_the_job(
    client: Client, deploy: Callable[[], str], redis_process: RedisProcess, events_file: Path, tmp_path: Path
) -> None:
    api = deploy()
    marker = tmp_path / "stalled"
    config = {"events": str(events_file), "stall_redis_after": 19, "stall_marker": str(marker),
              "redis_pid": redis_process.pid, "stall_s": STALL_S}
    spec = client.submit(api, list(range(20)), batch_size=2, workers=1, config=config)

    # The predictor stops Redis right after the last batch's predict call: its outcome is recorded
    # into a stalled Redis, which runs the recording when it wakes up, 8 s later.
    _wait_for(lambda: read_marker(marker), 60, "the stall of the last batch's recording")
    final = wait_job(client, api, spec["job_id"], timeout=60)

    assert final["status"] == "status_succeeded", final
    assert final["batch_metrics"]["succeeded"] == 10
    seen = read_events(events_file)
    assert _items_done(seen) == Counter(range(20))
    assert _completions(seen) == 1


# -- fault 6: a stall while the job is submitted and enqueued --------------------------------------
def test_a_redis_stall_while_the_api_validates_the_input_is_ridden_out(
    client: Client, deploy: Callable[[], str], redis_process: RedisProcess, events_file: Path, tmp_path: Path
) -> None:
    api = deploy()
    lines = 4_000_000  # seconds of validation in the API, whose enqueuer shows progress every second
    big = tmp_path / "big.jsonl"
    with open(big, "w") as f:
        for start in range(0, lines, 100_000):
            f.write("".join(f'{{"n": {i}}}\n' for i in range(start, start + 100_000)))
    body = {"delimited_files": {"s3_paths": [str(big)], "batch_size": 50_000}, "workers": 2,
            "config": {"events": str(events_file)}}
    with stall_once_a_job_enqueues(redis_process, STALL_S):  # the API answers before its enqueuer is done
        spec = client.submit_raw(api, body)

    final = wait_job(client, api, spec["job_id"], timeout=120)
    assert final["status"] == "status_succeeded", final
    assert final["batch_metrics"]["succeeded"] == 80
    seen = read_events(events_file)
    assert _spans_done(seen) == [(start, start + 49_999) for start in range(0, lines, 50_000)]  # each once
    assert _completions(seen) == 1


def test_a_job_submitted_while_redis_stalls_waits_for_it_and_runs(
    client: Client, deploy: Callable[[], str], redis_process: RedisProcess, events_file: Path
) -> None:
    api = deploy()

    with redis_process.stalled(STALL_S):
        spec = client.submit(api, list(range(50)), batch_size=1, workers=2, config={"events": str(events_file)})

    final = wait_job(client, api, spec["job_id"], timeout=60)
    assert final["status"] == "status_succeeded", final
    seen = read_events(events_file)
    assert _items_done(seen) == Counter(range(50))
    assert _completions(seen) == 1


# -- fault 2: Redis killed and restarted on its append-only file mid-job -----------------------------
def test_a_redis_restart_mid_job_costs_the_job_seconds_and_runs_no_item_twice(
    client: Client, deploy: Callable[[], str], redis_process: RedisProcess, events_file: Path
) -> None:
    api = deploy()
    items = 300
    spec = client.submit(api, list(range(items)), batch_size=1, workers=2,
                         config={"events": str(events_file), "sleep": 0.02})
    _wait_for(lambda: sum(e["event"] == "done" for e in read_events(events_file)) >= 60, 60, "a fifth of the job")

    redis_process.kill()
    killed = time.time()
    time.sleep(DOWN_S)
    redis_process.restart()
    restarted = time.time()

    final = wait_job(client, api, spec["job_id"], timeout=120)
    finished = time.time()
    seen = read_events(events_file)
    done = _items_done(seen)
    resumed = min(e["at"] for e in seen if e["event"] == "predict" and e["at"] > restarted)
    print(f"\nRedis kill + restart on its AOF mid-job ({DOWN_S:.0f} s down): batches ran again "
          f"{resumed - restarted:.1f} s after the restart, the job finished {finished - restarted:.1f} s after it "
          f"({finished - killed:.1f} s after the kill); items run twice: {sum(n > 1 for n in done.values())}")
    assert final["status"] == "status_succeeded", final
    assert final["batch_metrics"]["succeeded"] == items
    assert done == Counter(range(items))  # each item ran exactly once
    assert _completions(seen) == 1


# -- fault 2, the rest: a node settles what it held when its connection broke -----------------------
def test_a_node_whose_connection_to_redis_breaks_gives_back_what_it_held_once_it_reconnects(
    client: Client, deploy: Callable[[], str], redis_process: RedisProcess, events_file: Path
) -> None:
    # Not stored until one batch is held: beat would place it on the live node, which would take them all.
    api, services, job = _a_job_made_by_hand(client, deploy, redis_process, events_file, batches=3, stored=False)
    with BatchPublisher(services.celery, job.job_id, job.queue) as publisher:
        for index in range(3):
            publisher.batch(index, [100 + index], None)
    # A live node holds one batch, unacknowledged and in flight, as when Redis went away while it ran it.
    node = f"worker1@{socket.gethostname()}"
    task_id, index = _take_one_unacknowledged(services, job.queue)
    services.store.create(job, JobStatus.RUNNING)
    services.store.seal(job.job_id, 3)
    services.store.begin_batch(job.job_id, index, Delivery(node, task_id, receipt_for(task_id)))
    services.placement.assign(job, time.time())
    _wait_for(lambda: services.store.state(job.job_id).succeeded == 2, 60, "the batches nobody holds")

    redis.Redis.from_url(redis_process.url).client_kill_filter(_type="normal", skipme=True)  # every connection drops

    final = wait_job(client, api, job.job_id, timeout=60)
    assert final["status"] == "status_succeeded", final
    done = _items_done(read_events(events_file))
    assert done == Counter([0, 100, 101, 102])


# -- fault 1, the rest: a completion that was never sent -----------------------------------------------
def test_a_job_whose_completion_task_was_never_sent_is_completed_by_beat(
    client: Client, deploy: Callable[[], str], redis_process: RedisProcess, events_file: Path
) -> None:
    api, services, job = _a_job_made_by_hand(client, deploy, redis_process, events_file, batches=2)
    services.store.seal(job.job_id, 2)
    services.store.record_success(job.job_id, 0, 0.1)
    # The recording that completed the job, whose caller died (or never heard the answer) before
    # sending the completion task.
    assert services.store.record_success(job.job_id, 1, 0.1) is Recorded.COMPLETED_JOB
    services.placement.assign(job, time.time())

    final = wait_job(client, api, job.job_id, timeout=60)

    assert final["status"] == "status_succeeded", final
    assert _completions(read_events(events_file), job.job_id) == 1


# -- the broker's own loss: nodes killed while taking a message ----------------------------------------
def test_batches_whose_messages_killed_nodes_were_taking_are_run_anyway(
    client: Client, deploy: Callable[[], str], redis_process: RedisProcess, events_file: Path
) -> None:
    api, services, job = _a_job_made_by_hand(client, deploy, redis_process, events_file, batches=3)
    with BatchPublisher(services.celery, job.job_id, job.queue, services.store) as publisher:
        for index in range(3):
            publisher.batch(index, [100 + index], None)
    services.store.seal(job.job_id, 3)
    # kombu takes a message with BRPOP and only then records it as unacknowledged: a node killed in
    # between takes it along; one killed after that, but before it began the batch, leaves it there.
    assert redis.Redis.from_url(redis_process.url).brpop([job.queue], timeout=5) is not None
    _take_one_unacknowledged(services, job.queue)
    services.placement.assign(job, time.time())

    final = wait_job(client, api, job.job_id, timeout=60)

    assert final["status"] == "status_succeeded", final
    assert _items_done(read_events(events_file)) == Counter([0, 100, 101, 102])
    assert _completions(read_events(events_file), job.job_id) == 1


def _a_job_made_by_hand(
    client: Client, deploy: Callable[[], str], redis_process: RedisProcess, events_file: Path, batches: int,
    stored: bool = True,
) -> tuple[str, Services, Job]:
    """A running job of a freshly deployed API, written straight to the store (unless not `stored`):
    nothing of it is queued, so the test can hold its messages or record its batches itself. Beat
    places a stored running job on the live nodes at its next step, which then take what is queued."""
    api = deploy()
    first = client.submit(api, [0], batch_size=1, config={"events": str(events_file)})
    wait_job(client, api, first["job_id"], timeout=60)
    settings = Settings(redis_url=redis_process.url)
    services = Services.connect(settings, create_celery(settings))
    template = services.store.get(first["job_id"])  # the API's code, spec and the job's config
    job = replace(template, job_id=new_job_id(), total_batch_count=batches, start_time=time.time())
    if stored:
        services.store.create(job, JobStatus.RUNNING)
    return api, services, job


def _take_one_unacknowledged(services: Services, queue: str) -> tuple[str, int]:
    taken: list[tuple[str, int]] = []
    with services.celery.connection_for_write() as conn:
        channel = conn.default_channel

        def on_message(body: Any, message: Any) -> None:
            taken.append((message.headers["id"], body[0][1]))

        with Consumer(channel, [Queue(queue, routing_key=queue)], callbacks=[on_message], prefetch_count=1):
            conn.drain_events(timeout=10)
        channel.do_restore = False  # this "node" gives nothing back itself
    return taken[0]
