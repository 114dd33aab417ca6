"""Redis Sentinel: the primary is killed (SIGKILL) and the sentinels promote its replica, while
the job store writes, while a real Sluice stack (API, proxy, beat, worker nodes) runs a job, serves
a realtime API's steady traffic and holds accepted AsyncAPI requests; and the killed primary,
started again on its own data, becomes a replica without anything it held being run again.

The store's client asks the sentinels for the primary and rides out the failover like a Redis
restart (`foundation/redis_clients.py`); the broker is kombu's Sentinel transport (`jobs/transport/broker.py`).
What the old primary acknowledged but had not yet copied to its replica is lost with it
(asynchronous replication); on loopback that is rare, and the job store's idempotent recording
and beat's search for lost batches (docs/batch-jobs.md, Reliability) make up for it, so these tests check
that every item is recorded once and `on_job_complete` runs once, not that no predict call ran twice.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
import requests
import yaml

from foundation import keys
from foundation.redis_clients import connect
from foundation.replica_directory import REPLICA_TTL_S
from jobs.batch.job import Job, JobStatus
from jobs.store import JobStore, Recorded, scripts
from sluice.client import Client
from sluice.embedded import Stack, free_port
from testbed.sentinel_cluster import SentinelCluster
from testbed.waiting import wait_for

from .conftest import FAST_LOOPS, ROOM, closing_client, read_events, write_project
from .redis_process import FAULTS_PREDICTOR

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelCluster]:
    """One deployment for the module: each test kills its primary, then brings it back as a replica."""
    running = SentinelCluster(tmp_path_factory.mktemp("sentinel-redis")).start()
    yield running
    running.close()


def test_the_store_keeps_writing_across_a_failover_and_its_scripts_run_on_the_new_primary(
    cluster: SentinelCluster,
) -> None:
    sentinel_cluster = cluster
    store = JobStore(connect(sentinel_cluster.address(), retry_s=30))
    job = Job(job_id="j", api_name="iris", workers=1, config={}, timeout=None, total_batch_count=2, start_time=0.0)
    store.create(job, JobStatus.RUNNING)
    store.seal("j", 2)
    assert store.record_success("j", 0, 0.1) is Recorded.COUNTED
    old = sentinel_cluster.primary_port()
    wait_for(lambda: store_replicated(sentinel_cluster), 10, "the replica to hold the job")

    sentinel_cluster.kill_primary()
    # Sent while no primary answers: repeated (RideOut) until the sentinels name the promoted
    # replica, whose script cache is empty (the recording is a Lua script: NOSCRIPT, loaded again).
    recorded = store.record_success("j", 1, 0.1)

    new = sentinel_cluster.wait_failover(old)
    assert new != old
    assert recorded is Recorded.COMPLETED_JOB
    assert store.state("j").succeeded == 2  # read from the new primary, through the sentinels
    assert store.status("j") is JobStatus.RUNNING
    record_batch = hashlib.sha1(scripts.source("record_batch").encode()).hexdigest()
    assert redis.Redis(port=new).script_exists(record_batch) == [True]  # loaded again there on NOSCRIPT
    cluster.rejoin(old)


def store_replicated(cluster: SentinelCluster) -> bool:
    """The replica has applied everything the primary has written (same replication offset)."""
    offsets = {port: redis.Redis(port=port).info("replication").get("master_repl_offset")
               for port in cluster.servers if cluster.servers[port].poll() is None}
    return len(set(offsets.values())) == 1


# -- a running stack --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def stack(cluster: SentinelCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Two worker nodes, beat, the API, the proxy and the replica manager, all finding Redis through
    the sentinels (no private Redis)."""
    env = {**FAST_LOOPS, **cluster.env(), "SLUICE_ENQUEUE_STALE_AFTER": "60"}
    with Stack(port=free_port(), offers=ROOM, workers=2, data_dir=tmp_path_factory.mktemp("sentinel-stack"),
               env=env) as running:
        assert not any(child.name == "redis" for child in running.children)
        yield running
        print(running.logs())


@pytest.fixture(scope="module")
def client(stack: Stack) -> Client:
    return closing_client(stack.url, timeout=120)


def deploy(client: Client, folder: Path) -> str:
    name = f"sentinel-{uuid.uuid4().hex[:8]}"
    client.deploy(write_project(folder / name, name, source=FAULTS_PREDICTOR))
    return name


def wait_job(client: Client, api: str, job_id: str, timeout: float = 120) -> dict[str, Any]:
    def ended() -> dict[str, Any] | None:
        try:
            state = client.job(api, job_id)
        except Exception:  # noqa: BLE001 - the API's own Redis calls ride the failover out; ask again
            return None
        return state if state["status"] not in ("status_enqueuing", "status_running") else None

    return dict(wait_for(ended, timeout, f"job {job_id} to end", interval=0.2))


def items_done(events: list[dict[str, Any]]) -> Counter[int]:
    return Counter(item for event in events if event["event"] == "done" for item in event["items"])


BATCH_SIZE = 50


@dataclass(frozen=True)
class Drill:
    """A job of `items` items whose Redis primary (`old`, now dead) was killed a fifth of the way in."""

    api: str
    job_id: str
    items: int
    events_file: Path
    old: int
    new: int
    final: dict[str, Any]


@pytest.fixture(scope="module")
def mid_job_drill(client: Client, cluster: SentinelCluster, tmp_path_factory: pytest.TempPathFactory,
                  ) -> Iterator[Drill]:
    folder = tmp_path_factory.mktemp("mid-job")
    api = deploy(client, folder)
    events_file = folder / "events.jsonl"
    items = 20_000
    spec = client.submit(api, list(range(items)), batch_size=BATCH_SIZE, workers=2,
                         config={"events": str(events_file), "sleep": 0.02})
    wait_for(lambda: len(items_done(read_events(events_file))) >= items // 5, 60, "a fifth of the job")

    old = cluster.kill_primary()
    killed = time.time()
    new = cluster.wait_failover(old)
    promoted = time.time()

    final = wait_job(client, api, spec["job_id"])
    finished = time.time()
    seen = read_events(events_file)
    resumed = min(e["at"] for e in seen if e["event"] == "predict" and e["at"] > promoted)
    print(f"\nRedis primary killed mid-job: replica promoted {promoted - killed:.1f} s later, batches ran again "
          f"{resumed - promoted:.1f} s after that, the job finished {finished - killed:.1f} s after the kill; "
          f"items run twice: {sum(n > 1 for n in items_done(seen).values())}")
    yield Drill(api, spec["job_id"], items, events_file, old, new, final)
    if cluster.servers[old].poll() is not None:  # the next test's failover needs a replica again
        cluster.rejoin(old)


def test_a_job_runs_to_its_end_through_a_failover_of_redis_mid_job(mid_job_drill: Drill) -> None:
    drill = mid_job_drill
    seen = read_events(drill.events_file)
    assert drill.final["status"] == "status_succeeded", drill.final
    assert drill.final["batch_metrics"]["succeeded"] == drill.items // BATCH_SIZE  # each batch recorded once
    assert set(items_done(seen)) == set(range(drill.items))
    assert sum(event["event"] == "complete" for event in seen) == 1  # on_job_complete once


def test_the_old_primary_back_on_its_own_data_becomes_a_replica_and_nothing_it_held_runs_again(
    client: Client, cluster: SentinelCluster, mid_job_drill: Drill, tmp_path: Path,
) -> None:
    drill = mid_job_drill
    before = read_events(drill.events_file)

    # Started as it was killed: a primary, on an append-only file that may hold queued batches and
    # in-flight deliveries of the drill's job. The sentinels make it a replica: a full copy of the
    # new primary replaces all of it.
    cluster.restart(drill.old)
    assert cluster.primary_port() == drill.new
    after_events = tmp_path / "events.jsonl"
    spec = client.submit(drill.api, list(range(40)), batch_size=1, workers=2, config={"events": str(after_events)})
    final = wait_job(client, drill.api, spec["job_id"])

    assert final["status"] == "status_succeeded" and final["batch_metrics"]["succeeded"] == 40
    after = read_events(after_events)
    assert items_done(after) == Counter(range(40))  # each batch of the new job ran once
    assert sum(event["event"] == "complete" for event in after) == 1
    assert read_events(drill.events_file) == before  # the drill's job: no batch, no completion again
    again = client.job(drill.api, drill.job_id)
    assert again["status"] == "status_succeeded" and again["batch_metrics"] == drill.final["batch_metrics"]
    assert cluster.primary_port() == drill.new


def test_worker_nodes_idle_through_a_failover_take_the_next_job(
    client: Client, cluster: SentinelCluster, stack: Stack, tmp_path: Path,
) -> None:
    api = deploy(client, tmp_path)
    old = cluster.kill_primary()  # the nodes are waiting on the primary's queues (BRPOP) meanwhile
    cluster.wait_failover(old)

    events_file = tmp_path / "events.jsonl"
    spec = client.submit(api, list(range(20)), batch_size=1, workers=2, config={"events": str(events_file)})

    final = wait_job(client, api, spec["job_id"])
    assert final["status"] == "status_succeeded", final
    assert set(items_done(read_events(events_file))) == set(range(20))
    assert {e["pid"] for e in read_events(events_file) if e["event"] == "done"} <= {
        child.process.pid for child in stack.children if child.is_worker}
    cluster.restart(old)


def test_a_deploy_while_redis_fails_over_is_whole_or_refused_with_a_message(
    client: Client, cluster: SentinelCluster, tmp_path: Path,
) -> None:
    name = f"deploy-{uuid.uuid4().hex[:8]}"
    files = {f"weights-{i}.txt": uuid.uuid4().hex * 4096 for i in range(8)}  # a bundle of some size
    project = write_project(tmp_path / name, name, source=FAULTS_PREDICTOR, files=files)
    outcome: dict[str, Any] = {}

    def deploy_now() -> None:
        try:
            outcome["deployed"] = client.deploy(project)
        except Exception as error:  # noqa: BLE001 - what the user would see is the assertion's subject
            outcome["error"] = error

    deploying = threading.Thread(target=deploy_now)
    deploying.start()
    old = cluster.kill_primary()  # the deploy is in flight: its bundle stored, its record being written
    cluster.wait_failover(old)
    deploying.join(120)
    assert not deploying.is_alive(), "the deploy never answered"

    if "error" in outcome:  # refused: with a message, and nothing half-made is deployed
        assert str(outcome["error"]).strip(), outcome
        assert name not in {api["name"] for api in wait_for(lambda: _apis(client), 30, "the API to answer")}
    else:  # made whole: nodes unpack its bundle and run its code
        events_file = tmp_path / "events.jsonl"
        spec = client.submit(name, list(range(4)), batch_size=1, workers=1, config={"events": str(events_file)})
        assert wait_job(client, name, spec["job_id"])["status"] == "status_succeeded"
        assert set(items_done(read_events(events_file))) == set(range(4))
    cluster.restart(old)


def _apis(client: Client) -> list[dict[str, Any]] | None:
    try:
        return list(client.list_apis())
    except Exception:  # noqa: BLE001 - the API's own Redis calls ride the failover out; ask again
        return None


# -- realtime traffic --------------------------------------------------------------------------------
ECHO_REALTIME = """
import os


class PythonPredictor:
    def __init__(self, config):
        pass

    def predict(self, payload):
        return {"echo": payload, "pid": os.getpid()}
"""


def deploy_realtime(client: Client, folder: Path) -> str:
    name = f"rt-{uuid.uuid4().hex[:8]}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "predictor.py").write_text(ECHO_REALTIME)
    api = {"name": name, "kind": "RealtimeAPI", "predictor": {"type": "python", "path": "predictor.py"},
           "autoscaling": {"min_replicas": 1}}
    (folder / "cortex.yaml").write_text(yaml.safe_dump([api], sort_keys=False))
    client.deploy(folder / "cortex.yaml")
    return name


class Traffic:
    """`senders` threads posting to one API through the public address, one connection a request,
    until stopped; every answer's status, or the exception a request raised, in order."""

    def __init__(self, url: str, senders: int) -> None:
        self.url = url
        self.answers: list[tuple[float, int]] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._send, args=(n,), daemon=True) for n in range(senders)]

    def _send(self, sender: int) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            try:
                response = requests.post(self.url, json={"sender": sender, "n": n}, timeout=30,
                                         headers={"Connection": "close"})
                ok = response.status_code // 100 == 2 and response.json()["echo"] == {"sender": sender, "n": n}
                self.answers.append((time.time(), response.status_code))
                if not ok:
                    self.failures.append(f"{response.status_code}: {response.text[:200]}")
            except requests.RequestException as e:
                self.failures.append(f"{type(e).__name__}: {e}")

    def __enter__(self) -> Traffic:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()

    def answered_since(self, moment: float) -> int:
        return sum(at > moment for at, _ in self.answers)


def proxy_seen(cluster: SentinelCluster) -> float:
    """When the proxy last published its routes, read from the primary the sentinels name."""
    records = redis.Redis(port=cluster.primary_port(), socket_timeout=1).hvals(keys.PROXIES)
    return max((json.loads(raw)["seen"] for raw in records), default=0.0)


def test_realtime_requests_through_the_proxy_all_succeed_while_redis_fails_over(
    client: Client, cluster: SentinelCluster, stack: Stack, tmp_path: Path,
) -> None:
    name = deploy_realtime(client, tmp_path / "project")
    client.wait_ready(name, timeout=120)

    with Traffic(f"{stack.url}/{name}", senders=3) as traffic:
        wait_for(lambda: len(traffic.answers) >= 30, 30, "steady traffic")
        old = cluster.kill_primary()
        killed = time.time()
        cluster.wait_failover(old)
        # Until the proxy has judged its routes from the new primary past the point where the records
        # written before the kill are a replica's allowance old, and requests went on meanwhile.
        wait_for(lambda: proxy_seen(cluster) > killed + REPLICA_TTL_S + 1, 30, "the proxy to read the new primary")
        wait_for(lambda: traffic.answered_since(killed + REPLICA_TTL_S + 1) >= 30, 30, "traffic after that")

    assert traffic.failures == []
    assert traffic.answered_since(killed) > 0 and all(status == 200 for _, status in traffic.answers)
    client.delete_api(name)
    cluster.restart(old)


# -- AsyncAPI requests --------------------------------------------------------------------------------
ECHO_ASYNC = """
import json, os, time


class PythonPredictor:
    def __init__(self, config):
        self.events = config["events"]

    def predict(self, payload, request_id):
        time.sleep(payload["sleep"])
        with open(self.events, "a") as f:
            f.write(json.dumps({"id": request_id, "pid": os.getpid(), "event": "done"}) + "\\n")
        return {"echo": payload}
"""


def test_async_requests_accepted_before_a_failover_all_complete_once(
    client: Client, cluster: SentinelCluster, tmp_path: Path,
) -> None:
    events_file = tmp_path / "events.jsonl"
    name = f"async-{uuid.uuid4().hex[:8]}"
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "predictor.py").write_text(ECHO_ASYNC)
    api = {"name": name, "kind": "AsyncAPI", "compute": {"cpu": 1},
           "predictor": {"type": "python", "path": "predictor.py", "config": {"events": str(events_file)}}}
    (folder / "cortex.yaml").write_text(yaml.safe_dump([api], sort_keys=False))
    client.deploy(folder / "cortex.yaml")
    first = client.submit_async(name, {"n": -1, "sleep": 0})
    assert client.wait_async(name, first, timeout=120)["status"] == "completed"  # a node has built it

    accepted = {client.submit_async(name, {"n": n, "sleep": 0.05}): n for n in range(40)}
    old = cluster.kill_primary()  # some ran, one is running, the rest are queued
    cluster.wait_failover(old)

    def ended(request_id: str) -> dict[str, Any] | None:
        try:
            answer = client.get_async(name, request_id)
        except Exception:  # noqa: BLE001 - the API's own Redis calls ride the failover out; ask again
            return None
        return answer if answer["status"] in ("completed", "failed") else None

    answers = {request_id: wait_for(lambda r=request_id: ended(r), 120, f"request {request_id}", interval=0.2)
               for request_id in accepted}
    assert {r: a["status"] for r, a in answers.items()} == dict.fromkeys(accepted, "completed")
    assert all(answers[r]["result"]["echo"]["n"] == n for r, n in accepted.items())
    done = Counter(event["id"] for event in read_events(events_file))
    assert {r: done[r] for r in accepted} == dict.fromkeys(accepted, 1)  # each ran once
    cluster.restart(old)
