"""The job store in Redis: the contract it shares with the in-memory store, and what only Redis does.

`store` is parametrised: every contract test (`tests/contracts/job_store.py`) runs against Redis's
`JobStore` and `MemoryJobStore`, on a real redis-server. Beside them, what only Redis has: expiry
of an ended job's keys, keys never left behind, a job's batches leaving their node's in-flight hash
in the same script that records them, and the stored hash's fields being those of `JobField`.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from jobs.batch.job import Job, JobStatus
from jobs.nodes.registry import Nodes
from jobs.store import JobField, JobStorage, JobStore
from jobs.store.memory import MemoryJobStore
from jobs.transport.delivery import Delivery
from tests.contracts.job_store import T0, JobStoreContract, make_job

TTL_S = 3600


class TestTheJobStoreInRedisAndInMemory(JobStoreContract):
    @pytest.fixture(params=["redis", "memory"])
    def store(self, request: pytest.FixtureRequest) -> Iterator[JobStorage]:
        if request.param == "memory":
            yield MemoryJobStore()
        else:
            client: redis.Redis = request.getfixturevalue("redis_client")
            yield JobStore(client, job_ttl_s=TTL_S)


@pytest.fixture
def store(redis_client: redis.Redis) -> JobStore:
    return JobStore(redis_client, job_ttl_s=TTL_S)


@pytest.fixture
def running(store: JobStore) -> Job:
    job = make_job()
    store.create(job, JobStatus.RUNNING)
    return job


def job_keys(client: redis.Redis, job_id: str) -> list[str]:
    return sorted(key.decode() for key in client.scan_iter(f"sluice:job:{job_id}*"))


def test_an_unknown_job_does_not_move_and_leaves_nothing_behind(store: JobStore, redis_client: redis.Redis) -> None:
    assert not store.transition("ghost", JobStatus.STOPPED, now=T0)

    assert redis_client.keys("*") == []


def test_an_active_job_never_expires(store: JobStore, redis_client: redis.Redis, running: Job) -> None:
    store.begin_batch(running.job_id, 0)
    store.record_failure(running.job_id, 0, 1.0, "boom", 2, [1])

    for key in job_keys(redis_client, running.job_id):
        assert redis_client.ttl(key) == -1, key


def test_every_key_of_an_ended_job_expires_after_the_job_ttl(
    store: JobStore, redis_client: redis.Redis, running: Job
) -> None:
    store.begin_batch(running.job_id, 0)
    store.record_failure(running.job_id, 0, 1.0, "boom", 2, [1])

    store.transition(running.job_id, JobStatus.COMPLETED_WITH_FAILURES, now=T0)

    keys = job_keys(redis_client, running.job_id)
    assert keys == [f"sluice:job:{running.job_id}{suffix}" for suffix in ("", ":done", ":failed", ":starts")]
    for key in keys:
        assert 0 < redis_client.ttl(key) <= TTL_S, key


def test_a_batch_finishing_after_its_job_was_stopped_leaves_no_key_that_never_expires(
    store: JobStore, redis_client: redis.Redis, running: Job
) -> None:
    store.begin_batch(running.job_id, 0)  # a worker is running batch 0 ...
    store.transition(running.job_id, JobStatus.STOPPED, message="stopped by request", now=T0)
    store.record_success(running.job_id, 0, 3.0)  # ... and reports it after the stop
    store.record_part(running.job_id, 0, 3)
    store.keep_payloads(running.job_id, {1: ([1], None)})

    for key in job_keys(redis_client, running.job_id):
        assert redis_client.ttl(key) > 0, f"{key} never expires"


def test_tries_used_up_by_the_time_limit_expire_with_the_job_ttl(
    store: JobStore, redis_client: redis.Redis, running: Job
) -> None:
    store.mark_timed_out(running.job_id, 0, 1)

    assert 0 < redis_client.ttl(f"sluice:job:{running.job_id}:timed_out") <= TTL_S


def test_a_batch_enters_its_nodes_in_flight_hash_when_it_begins_and_leaves_it_when_recorded(
    store: JobStore, redis_client: redis.Redis, running: Job
) -> None:
    nodes = Nodes(redis_client, node_ttl_s=5)
    delivery = Delivery("busy@host", "task-1")

    store.begin_batch(running.job_id, 0, delivery)
    assert nodes.inflight("busy@host") == {"task-1": "job-1:0"}
    store.record_success(running.job_id, 0, 0.1, delivery)

    assert nodes.inflight("busy@host") == {}


def test_the_stored_hash_holds_only_the_fields_jobfield_names(
    store: JobStore, redis_client: redis.Redis, running: Job
) -> None:
    store.set_nodes(running.job_id, ["celery@a"])
    store.touch_enqueue(running.job_id, T0 + 1)
    store.note_predictor(running.job_id, "building the predictor on celery@a")
    store.record_success(running.job_id, 0, 0.1)
    store.record_failure(running.job_id, 1, 0.1, "boom", 1, [1])
    store.seal(running.job_id, 2, now=T0 + 2)
    store.claim_completion(running.job_id, "task-1/a", "task-1")
    store.mark_hook_done(running.job_id)
    store.mark_completion_resent(running.job_id, T0 + 3)
    store.transition(running.job_id, JobStatus.SUCCEEDED, message="done", now=T0 + 4)

    stored = {field.decode() for field in redis_client.hkeys(f"sluice:job:{running.job_id}")}

    assert stored == {field.value for field in JobField}
