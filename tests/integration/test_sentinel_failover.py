"""Redis Sentinel: the primary is killed (SIGKILL) and the sentinels promote its replica, while
the job store writes and while a real Sluice stack (API, beat, worker nodes) runs a job.

The store's client asks the sentinels for the primary and rides out the failover like a Redis
restart (`foundation/redis_clients.py`); the broker is kombu's Sentinel transport (`jobs/broker.py`).
What the old primary acknowledged but had not yet copied to its replica is lost with it
(asynchronous replication); on loopback that is rare, and the job store's idempotent recording
and beat's search for lost batches (README, Reliability) make up for it, so these tests check
that every item is recorded once and `on_job_complete` runs once, not that no predict call ran twice.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from foundation.redis_clients import connect
from jobs.job import Job, JobStatus
from jobs.store import JobStore, Recorded, scripts
from sluice.client import Client
from sluice.embedded import Stack, free_port

from .conftest import FAST_LOOPS, closing_client, read_events, write_project
from .redis_process import FAULTS_PREDICTOR
from .sentinel_cluster import SentinelCluster
from .waiting import wait_for

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
    """Two worker nodes, beat and the API, all finding Redis through the sentinels (no private Redis)."""
    env = {**FAST_LOOPS, **cluster.env(), "SLUICE_ENQUEUE_STALE_AFTER": "60"}
    with Stack(port=free_port(), workers=2, data_dir=tmp_path_factory.mktemp("sentinel-stack"), env=env,
               proxy=False, realtime=False) as running:
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


def test_a_job_runs_to_its_end_through_a_failover_of_redis_mid_job(
    client: Client, cluster: SentinelCluster, tmp_path: Path,
) -> None:
    api = deploy(client, tmp_path)
    events_file = tmp_path / "events.jsonl"
    items = 300
    spec = client.submit(api, list(range(items)), batch_size=1, workers=2,
                         config={"events": str(events_file), "sleep": 0.02})
    wait_for(lambda: sum(e["event"] == "done" for e in read_events(events_file)) >= 60, 60, "a fifth of the job")

    old = cluster.kill_primary()
    killed = time.time()
    cluster.wait_failover(old)
    promoted = time.time()

    final = wait_job(client, api, spec["job_id"])
    finished = time.time()
    seen = read_events(events_file)
    done = items_done(seen)
    resumed = min(e["at"] for e in seen if e["event"] == "predict" and e["at"] > promoted)
    print(f"\nRedis primary killed mid-job: replica promoted {promoted - killed:.1f} s later, batches ran again "
          f"{resumed - promoted:.1f} s after that, the job finished {finished - killed:.1f} s after the kill; "
          f"items run twice: {sum(n > 1 for n in done.values())}")
    assert final["status"] == "status_succeeded", final
    assert final["batch_metrics"]["succeeded"] == items  # each item recorded once
    assert set(done) == set(range(items))
    assert sum(event["event"] == "complete" for event in seen) == 1  # on_job_complete once
    cluster.rejoin(old)  # a replica again, for the next failover


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
