"""The Batch API as a user calls it (`/batch/<api>`), through Flask's test client.

Fast: the app is built with `create_app(services=...)` around the in-memory job store, node registry
and job queues (they pass their contract tests) and kombu's in-memory broker, with the foundation's
in-memory API registry, replica directory, log streams and figure store in its extensions. No worker
runs: batches are recorded the way a worker records them, through the store, and the enqueuer's
thread is joined, never slept on.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from flask import Flask
from flask.testing import FlaskClient

from api import context
from api.app import create_app
from foundation.figures import Recorder
from foundation.memory import (
    MemoryAcknowledgements,
    MemoryApiRegistry,
    MemoryFigureStore,
    MemoryIdempotencyKeys,
    MemoryLogStreams,
    MemoryPredictorBuilds,
    MemoryReplicaDirectory,
)
from foundation.settings import Settings
from jobs.batch.job import JobStatus
from jobs.nodes.memory import MemoryNodes, MemoryWorkerHosts
from jobs.placement.batch import Placement
from jobs.services import Services
from jobs.store.memory import MemoryJobStore
from jobs.tasks import RUN_BATCH
from jobs.transport.memory import MemoryJobQueues
from predictors_runtime.bundles import BundleStore
from predictors_runtime.config import ApiConfig

API = {"name": "iris", "kind": "BatchAPI", "predictor": {"type": "python", "path": "predictor.py"}}


@pytest.fixture
def services(tmp_path: Path) -> Services:
    settings = Settings(storage=str(tmp_path / "storage"), local_input_roots=(str(tmp_path),))
    celery = Celery("sluice-test", broker="memory://", set_as_current=False)
    celery.conf.update(task_serializer="json", accept_content=["json"])
    store = MemoryJobStore()
    nodes = MemoryNodes(settings.node_ttl_s, inflight=store.inflight)
    queues = MemoryJobQueues()
    return Services(
        settings=settings, celery=celery, redis=redis.Redis(), store=store, nodes=nodes,  # a client never used
        placement=Placement(queues, store, nodes), queues=queues,
        bundles=BundleStore(settings.storage, tmp_path / "cache"), worker_host_store=MemoryWorkerHosts(),
        acks=MemoryAcknowledgements(), idempotency_keys=MemoryIdempotencyKeys(),
    )


@pytest.fixture
def registry() -> MemoryApiRegistry:
    registry = MemoryApiRegistry()
    registry.put(ApiConfig.from_dict(API), "sha256-abc")
    return registry


def app_of(services: Services, registry: MemoryApiRegistry) -> Flask:
    """The management app around `services`, its registries and figures in memory."""
    figures = MemoryFigureStore()
    app = create_app(services=services, recorder=Recorder(figures))
    app.extensions.update({
        context.REGISTRY: registry, context.PREDICTOR_BUILDS: MemoryPredictorBuilds(),
        context.REPLICAS: MemoryReplicaDirectory(), context.LOG_STREAMS: MemoryLogStreams(),
        context.FIGURE_STORE: figures,
    })
    return app


@pytest.fixture
def client(services: Services, registry: MemoryApiRegistry) -> Iterator[FlaskClient]:
    app = app_of(services, registry)
    with app.test_client() as client:
        yield client
    app.extensions["sluice.figures"].close()


def submitted(client: FlaskClient, body: dict[str, Any]) -> str:
    """Submit a job and wait for its enqueuer to finish; returns its id."""
    answer = client.post("/batch/iris", json=body)
    assert answer.status_code == 200, answer.get_json()
    job_id = answer.get_json()["job_id"]
    for thread in threading.enumerate():
        if thread.name == f"enqueue-{job_id}":
            thread.join()
    return job_id


def job_status(client: FlaskClient, job_id: str) -> dict[str, Any]:
    answer = client.get(f"/batch/iris?jobID={job_id}")
    assert answer.status_code == 200, answer.get_json()
    return answer.get_json()["job_status"]


def test_a_submitted_item_list_becomes_a_running_job_with_its_batches_queued(
    client: FlaskClient, services: Services
) -> None:
    answer = client.post("/batch/iris", json={"item_list": {"items": [[5.1, 3.5], [6.2, 2.9], [7.7, 3.0]],
                                                            "batch_size": 2}, "workers": 1})

    spec = answer.get_json()
    assert answer.status_code == 200
    assert (spec["api_name"], spec["kind"], spec["workers"], spec["total_batch_count"]) == ("iris", "BatchAPI", 1, 2)
    job_id = spec["job_id"]
    for thread in threading.enumerate():
        if thread.name == f"enqueue-{job_id}":
            thread.join()
    status = job_status(client, job_id)
    assert status["status"] == "status_running"
    assert status["batches_in_queue"] == 2
    with services.celery.connection_for_read() as conn:
        queue = conn.SimpleQueue(f"job.{job_id}")
        tasks = [queue.get(timeout=1) for _ in range(2)]
        queue.close()
    assert [(t.headers["task"], t.payload[0][1]) for t in tasks] == [(RUN_BATCH, 0), (RUN_BATCH, 1)]


def test_a_job_shows_its_progress_as_its_batches_are_recorded(client: FlaskClient, services: Services) -> None:
    job_id = submitted(client, {"item_list": {"items": [1, 2, 3], "batch_size": 1}})

    services.store.record_success(job_id, 0, 0.25)
    services.store.record_failure(job_id, 1, 0.75, "ValueError: bad row", 1, [2])

    status = job_status(client, job_id)
    assert status["batch_metrics"] == {"succeeded": 1, "failed": 1, "average_time_per_batch": 0.5}
    assert status["batches_in_queue"] == 1
    failed = client.get(f"/batch/iris/failed?jobID={job_id}").get_json()
    assert failed["failed_batches"] == [{"index": 1, "error": "ValueError: bad row", "tries": 1, "payload": [2]}]


def test_jobs_are_listed_newest_first_and_a_stopped_job_cannot_be_stopped_twice(client: FlaskClient) -> None:
    first = submitted(client, {"item_list": {"items": [1], "batch_size": 1}})
    second = submitted(client, {"item_list": {"items": [1], "batch_size": 1}})

    listed = [job["job_id"] for job in client.get("/batch/iris").get_json()["jobs"]]
    assert sorted(listed) == sorted([first, second]) and listed == sorted(listed, reverse=True)

    stopped = client.delete(f"/batch/iris?jobID={first}")
    assert stopped.status_code == 200
    assert job_status(client, first)["status"] == JobStatus.STOPPED.value
    again = client.delete(f"/batch/iris?jobID={first}")
    assert again.status_code == 409
    assert again.get_json()["kind"] == "conflict"


def test_an_unknown_job_or_api_is_a_404_and_a_bad_submission_a_400_creating_nothing(
    client: FlaskClient, services: Services
) -> None:
    assert client.get("/batch/iris?jobID=0123456789abcdef0000").status_code == 404
    assert client.post("/batch/nope", json={"item_list": {"items": [1], "batch_size": 1}}).status_code == 404

    bad = client.post("/batch/iris", json={"item_list": {"items": [], "batch_size": 1}})

    assert bad.status_code == 400
    assert "item_list.items" in bad.get_json()["message"]
    assert services.store.list_ids("iris") == []


def test_a_dry_run_checks_the_submission_and_creates_no_job(client: FlaskClient, services: Services) -> None:
    answer = client.post("/batch/iris?dryRun=true", json={"item_list": {"items": [1, 2, 3], "batch_size": 2}})

    assert answer.status_code == 200
    assert (answer.get_json()["dry_run"], answer.get_json()["total_batch_count"]) == (True, 2)
    assert services.store.list_ids("iris") == []


def test_cortexs_endpoint_at_the_apis_own_path_submits_reads_lists_and_stops_a_job(client: FlaskClient) -> None:
    answer = client.post("/iris", json={"item_list": {"items": [1, 2, 3], "batch_size": 2}, "workers": 1})
    assert answer.status_code == 200, answer.get_json()
    job_id = answer.get_json()["job_id"]
    for thread in threading.enumerate():
        if thread.name == f"enqueue-{job_id}":
            thread.join()

    read = client.get(f"/iris?jobID={job_id}").get_json()
    assert read["job_status"]["job_id"] == job_id and read["job_status"]["status"] == "status_running"
    assert read["endpoint"] == "http://localhost/iris"  # Cortex's: the API's own path
    assert read["api_spec"]["name"] == "iris"
    assert client.get(f"/batch/iris?jobID={job_id}").get_json()["endpoint"] == "http://localhost/iris"
    assert [job["job_id"] for job in client.get("/iris").get_json()["jobs"]] == [job_id]

    stopped = client.delete(f"/iris?jobID={job_id}")
    assert stopped.status_code == 200 and stopped.get_json() == {"message": f"stopped job {job_id}"}
    assert job_status(client, job_id)["status"] == JobStatus.STOPPED.value
    assert client.delete(f"/iris?jobID={job_id}").status_code == 409
    assert client.delete("/iris").status_code == 400  # jobID is required
    assert client.get("/iris?jobID=0123456789abcdef0000").get_json()["kind"] == "job_not_found"


def test_the_api_description_carries_an_absolute_endpoint(client: FlaskClient) -> None:
    assert client.get("/apis/iris").get_json()["endpoint"] == "http://localhost/iris"


def test_a_realtime_api_takes_no_jobs_and_its_path_refuses_delete(
    client: FlaskClient, services: Services, registry: MemoryApiRegistry
) -> None:
    realtime = {"name": "live", "kind": "RealtimeAPI", "predictor": {"type": "python", "path": "predictor.py"}}
    registry.put(ApiConfig.from_dict(realtime), "sha256-def")
    body = {"item_list": {"items": [1], "batch_size": 1}}

    at_batch = client.post("/batch/live", json=body)
    deleted = client.delete("/live?jobID=0123456789abcdef0000")

    assert at_batch.status_code == 404 and at_batch.get_json()["kind"] == "api_not_found"
    assert "RealtimeAPI" in at_batch.get_json()["message"]
    assert services.store.list_ids("live") == []
    assert deleted.status_code == 405 and set(deleted.headers["Allow"].split(", ")) >= {"GET", "POST"}
    assert client.post("/live", json=body).get_json()["kind"] == "not_ready"  # no replica: the fallback's answer


def test_with_api_keys_a_job_at_the_apis_own_path_wants_a_key_while_realtime_answers_stay_open(
    services: Services,
) -> None:
    from dataclasses import replace

    keyed = replace(services, settings=replace(services.settings, api_keys=("s3cret",)))
    registry = MemoryApiRegistry()
    registry.put(ApiConfig.from_dict(API), "sha256-abc")
    registry.put(ApiConfig.from_dict({**API, "name": "live", "kind": "RealtimeAPI"}), "sha256-def")
    app = app_of(keyed, registry)
    body = {"item_list": {"items": [1], "batch_size": 1}}
    try:
        with app.test_client() as client:
            refused = [client.open("/iris", method=method, json=body if method == "POST" else None)
                       for method in ("POST", "GET", "DELETE")]
            accepted = client.post("/iris", json=body, headers={"Authorization": "Bearer s3cret"})
            realtime = client.post("/live", json=body)
    finally:
        app.extensions["sluice.figures"].close()

    assert [r.status_code for r in refused] == [401, 401, 401]
    assert all(r.headers["WWW-Authenticate"] == "Bearer" for r in refused)
    assert accepted.status_code == 200
    assert services.store.list_ids("iris") == [accepted.get_json()["job_id"]]
    assert realtime.status_code == 503  # open as realtime APIs are without SLUICE_PROTECT_REALTIME


# -- answers that are promises (api/promises.py): a submission sent twice with one Idempotency-Key
# makes one job, and a write no Redis replica confirmed is answered 503 with the key to retry by
# (the retry then gets the job the first one made); MemoryAcknowledgements stands for the replicas.
PROMISED_JOB = {"item_list": {"items": [1, 2, 3], "batch_size": 2}, "workers": 1}


def _joined(job_id: str) -> None:
    for thread in threading.enumerate():
        if thread.name == f"enqueue-{job_id}":
            thread.join()


def test_the_same_idempotency_key_gives_the_same_job_and_another_key_a_new_one(client: FlaskClient,
                                                                               services: Services) -> None:
    first = client.post("/batch/iris", json=PROMISED_JOB, headers={"Idempotency-Key": "k-1"})
    again = client.post("/batch/iris", json=PROMISED_JOB, headers={"Idempotency-Key": "k-1"})
    other = client.post("/batch/iris", json=PROMISED_JOB, headers={"Idempotency-Key": "k-2"})
    plain = client.post("/batch/iris", json=PROMISED_JOB)
    for answer in (first, again, other, plain):
        assert answer.status_code == 200, answer.get_json()
        _joined(answer.get_json()["job_id"])
    assert again.get_json()["job_id"] == first.get_json()["job_id"]
    assert again.headers["Idempotent-Replayed"] == "true" and "Idempotent-Replayed" not in first.headers
    assert len({a.get_json()["job_id"] for a in (first, other, plain)}) == 3
    assert len(services.store.list_ids("iris", limit=10)) == 3


def test_a_key_is_per_api_kind_of_submission_and_must_look_like_a_key(client: FlaskClient) -> None:
    refused = client.post("/batch/iris", json=PROMISED_JOB, headers={"Idempotency-Key": "has spaces"})
    assert refused.status_code == 400
    assert "Idempotency-Key must be 1 to 255 letters" in refused.get_json()["message"]
    assert client.post("/batch/iris", json=PROMISED_JOB, headers={"Idempotency-Key": "x" * 256}).status_code == 400


def test_a_write_no_replica_confirmed_is_refused_and_its_retry_gets_the_job_it_made(client: FlaskClient,
                                                                                   services: Services) -> None:
    cut_off = MemoryAcknowledgements(replicas=1, confirmed_by=0)
    services.acks = cut_off
    refused = client.post("/batch/iris", json=PROMISED_JOB, headers={"Idempotency-Key": "k-cut"})
    assert refused.status_code == 503
    body = refused.get_json()
    assert body["kind"] == "not_acknowledged"
    assert "0 of 1 replica(s) confirmed it" in body["message"] and "may or may not have taken" in body["message"]
    assert "retry with the same Idempotency-Key (k-cut)" in body["message"]
    assert (refused.headers["Idempotency-Key"], refused.headers["Retry-After"]) == ("k-cut", "1")
    # The primary did take it: one job exists, unconfirmed.
    [made] = services.store.list_ids("iris", limit=10)
    _joined(made)

    cut_off.confirmed_by = 1  # the replica caught up
    retried = client.post("/batch/iris", json=PROMISED_JOB, headers={"Idempotency-Key": "k-cut"})
    assert retried.status_code == 200 and retried.get_json()["job_id"] == made
    assert services.store.list_ids("iris", limit=10) == [made]
    # A write without a key is told that a retry is safe only if doing it twice is; no Retry-After.
    cut_off.confirmed_by = 0
    bare = client.post("/batch/iris", json=PROMISED_JOB)
    assert bare.status_code == 503 and "Retry-After" not in bare.headers
    assert "retrying it is safe only if doing it twice is" in bare.get_json()["message"]


def test_reads_wait_for_no_replica_and_writes_wait_once_each(client: FlaskClient, services: Services) -> None:
    counted = MemoryAcknowledgements()
    services.acks = counted
    job_id = client.post("/batch/iris", json=PROMISED_JOB).get_json()["job_id"]
    _joined(job_id)
    assert counted.confirmed == 1
    assert client.get(f"/batch/iris?jobID={job_id}").status_code == 200
    assert client.get("/batch/iris").status_code == 200
    assert counted.confirmed == 1
    assert client.delete(f"/batch/iris?jobID={job_id}").status_code == 200
    assert counted.confirmed == 2
    # A refused write (404) waits for nothing.
    assert client.post("/batch/nope", json=PROMISED_JOB).status_code == 404
    assert counted.confirmed == 2


def test_a_claim_whose_job_never_came_is_taken_over_once_stale_and_refused_while_fresh(client: FlaskClient,
                                                                                       services: Services) -> None:
    keys = services.idempotency
    assert isinstance(keys, MemoryIdempotencyKeys)
    keys.claims[("batch:iris", "k-dead")] = "000000000001deadbeef"  # claimed in 1970, its job never made
    taken = client.post("/batch/iris", json=PROMISED_JOB, headers={"Idempotency-Key": "k-dead"})
    assert taken.status_code == 200
    _joined(taken.get_json()["job_id"])
    assert keys.claims[("batch:iris", "k-dead")] == taken.get_json()["job_id"]

    keys.claims[("batch:iris", "k-busy")] = "fffffffffffffeedbeef"  # a claim being made now (its id is in the future)
    busy = client.post("/batch/iris", json=PROMISED_JOB, headers={"Idempotency-Key": "k-busy"})
    assert busy.status_code == 409
    assert "a submission with Idempotency-Key k-busy is being made" in busy.get_json()["message"]


def test_a_submission_that_fails_gives_its_key_back(client: FlaskClient, services: Services) -> None:
    bad = client.post("/batch/iris", json={"item_list": {"items": [1], "batch_size": 1}, "workers": 1,
                                           "config": "not an object"}, headers={"Idempotency-Key": "k-bad"})
    assert bad.status_code == 400
    assert ("batch:iris", "k-bad") not in services.idempotency.claims  # type: ignore[attr-defined]
