"""Answers that are promises, drilled: Redis Sentinel with a replica whose replication stream is
cut (a relay drops it, the connection stays up, as on a broken link), submissions and AsyncAPI
requests arriving, the primary SIGKILLed and the replica promoted. Every submission answered 2xx
is there afterwards; every one the replica had not confirmed was refused 503 `not_acknowledged`
with the key to retry by; and a retry with the same `Idempotency-Key` gives the same job, before
the failover and after it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from sluice.client import Client, NotAcknowledged, RetryPolicy
from sluice.embedded import Stack, free_port
from testbed.sentinel_cluster import SentinelCluster
from testbed.waiting import wait_for

from .conftest import FAST_LOOPS, ROOM, closing_client, write_project

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ASYNC_PREDICTOR = '''
class PythonPredictor:
    def __init__(self, config):
        pass

    def predict(self, payload):
        return {"echo": payload}
'''
JOB = {"workers": 1, "item_list": {"items": [1, 2, 3, 4], "batch_size": 2}}
CUT_OFF = 5  # submissions, and as many AsyncAPI requests, sent while the replica is cut off


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelCluster]:
    running = SentinelCluster(tmp_path_factory.mktemp("acked-redis"), relayed=True).start()
    yield running
    running.close()


@pytest.fixture(scope="module")
def stack(cluster: SentinelCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    env = {**FAST_LOOPS, **cluster.env(), "SLUICE_ACK_TIMEOUT_MS": "500"}
    with Stack(port=free_port(), offers=ROOM, workers=1, data_dir=tmp_path_factory.mktemp("acked-stack"),
               env=env) as running:
        yield running
        print(running.logs())


def _deploy_async(client: Client, folder: Path, name: str) -> None:
    folder.mkdir(parents=True)
    (folder / "predictor.py").write_text(ASYNC_PREDICTOR)
    api = {"name": name, "kind": "AsyncAPI", "predictor": {"type": "python", "path": "predictor.py"},
           "compute": {"cpu": 1}}
    (folder / "cortex.yaml").write_text(yaml.safe_dump([api]))
    client.deploy(folder / "cortex.yaml")


def test_what_was_answered_survives_a_failover_and_what_was_not_was_refused_with_its_key(
    stack: Stack, cluster: SentinelCluster, tmp_path: Path,
) -> None:
    # With the link whole, a loaded machine may still miss a wait now and then: that client retries
    # with its key (the same job either way). While the link is cut, one that does not retry by
    # itself, so that each refusal is seen here.
    client = closing_client(stack.url, timeout=60)
    cut_client = closing_client(stack.url, timeout=60, retries=RetryPolicy(retries=0))
    batch, asynchronous = f"acked-{uuid.uuid4().hex[:6]}", f"acked-async-{uuid.uuid4().hex[:6]}"
    client.deploy(write_project(tmp_path / batch, batch, {"events": str(tmp_path / "events.jsonl")}))
    _deploy_async(client, tmp_path / asynchronous, asynchronous)

    # With the link whole, every answer waited for the replica and got it.
    answered = {f"before-{n}": client.submit_job(batch, JOB, idempotency_key=f"before-{n}")["job_id"]
                for n in range(3)}
    answered_async = {f"async-before-{n}": client.submit_async(asynchronous, {"n": n},
                                                               idempotency_key=f"async-before-{n}")
                      for n in range(3)}
    # A retry with the same key, before any failover: the same job.
    assert client.submit_job(batch, JOB, idempotency_key="before-0")["job_id"] == answered["before-0"]

    # The replica stops receiving the primary's stream; the primary still counts it connected.
    assert cluster.relay is not None
    cluster.relay.drop()
    refused: dict[str, str] = {}
    for n in range(CUT_OFF):
        key = f"cut-{n}"
        try:
            answered[key] = cut_client.submit_job(batch, JOB, idempotency_key=key)["job_id"]
        except NotAcknowledged as e:
            refused[key] = str(e)
        try:
            answered_async[f"async-{key}"] = cut_client.submit_async(asynchronous, {"n": n},
                                                                     idempotency_key=f"async-{key}")
        except NotAcknowledged as e:
            refused[f"async-{key}"] = str(e)
    assert len(refused) == 2 * CUT_OFF, sorted(answered)  # nothing was answered while no replica confirmed
    for key, message in refused.items():
        assert "may or may not have taken" in message and f"Idempotency-Key ({key})" in message, message
    assert cluster.relay.dropped_bytes > 0

    old = cluster.kill_primary()
    killed = time.monotonic()
    cluster.wait_failover(old)
    promoted = time.monotonic() - killed

    # Every answered submission is there, on the promoted replica.
    for key, job_id in answered.items():
        status = wait_for(lambda job_id=job_id: _ended(client, batch, job_id), 120, f"job {job_id} ({key})")
        assert status == "status_succeeded", (key, status)
    for key, request_id in answered_async.items():
        done = client.wait_async(asynchronous, request_id, timeout=120)
        assert done["status"] == "completed", (key, done)
    # A retry with an answered key after the failover: still the same job.
    assert client.submit_job(batch, JOB, idempotency_key="before-1")["job_id"] == answered["before-1"]
    # The refused ones, retried with their keys: one job each, the same on a second retry.
    for n in range(CUT_OFF):
        key = f"cut-{n}"
        job_id = client.submit_job(batch, JOB, idempotency_key=key)["job_id"]
        assert client.submit_job(batch, JOB, idempotency_key=key)["job_id"] == job_id
        request_id = client.submit_async(asynchronous, {"n": n}, idempotency_key=f"async-{key}")
        assert client.wait_async(asynchronous, request_id, timeout=120)["status"] == "completed"
    print(f"\nreplica cut off: {len(answered)} submissions answered 200 before the cut, all kept; "
          f"{len(refused)} refused not_acknowledged during it; replica promoted {promoted:.1f} s after the kill")


def _ended(client: Client, api: str, job_id: str) -> str | None:
    try:
        status = str(client.job(api, job_id)["status"])
    except Exception:  # noqa: BLE001 - the API's own calls ride the failover out; ask again
        return None
    return None if status in ("status_enqueuing", "status_running") else status
