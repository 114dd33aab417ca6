"""The AsyncAPI request store in Redis keeps the contract it shares with the in-memory store
(`tests/contracts/async_store.py`), run against both (a parametrised fixture) on a real redis-server,
and what only Redis has: keys that expire on their own.
"""

from __future__ import annotations

import pytest
import redis

from foundation import keys
from jobs.async_placement import AsyncAssignments, RedisAsyncAssignments
from jobs.async_store import WAKE_TTL_S, AsyncRequestStore, RedisAsyncRequests
from jobs.memory_async import MemoryAsyncAssignments, MemoryAsyncRequests
from tests.contracts.async_store import RETENTION_S, T0, AsyncRequestStoreContract, queued


class TestTheAsyncRequestStoreInRedisAndInMemory(AsyncRequestStoreContract):
    @pytest.fixture(params=["redis", "memory"])
    def requests(self, request: pytest.FixtureRequest) -> AsyncRequestStore:
        if request.param == "memory":
            return MemoryAsyncRequests(retention_s=RETENTION_S)
        return RedisAsyncRequests(request.getfixturevalue("redis_client"), retention_s=RETENTION_S)


def test_the_queued_list_and_a_deliverys_claims_expire_with_the_retention(redis_client: redis.Redis) -> None:
    requests = RedisAsyncRequests(redis_client, retention_s=RETENTION_S)
    queued(requests, "r1", "r2")
    requests.claim("echo", "task-9", 1, T0)
    for key in (keys.async_queued("echo"), keys.async_claims("echo", "task-9")):
        assert 0 < redis_client.ttl(key) <= RETENTION_S
    requests.release("echo", "task-9")
    assert not redis_client.exists(keys.async_claims("echo", "task-9"))


@pytest.mark.parametrize("backend", ["redis", "memory"])
def test_the_nodes_placed_on_each_async_api_are_kept_and_forgotten(backend: str,
                                                                    request: pytest.FixtureRequest) -> None:
    assignments: AsyncAssignments = (RedisAsyncAssignments(request.getfixturevalue("redis_client"))
                                     if backend == "redis" else MemoryAsyncAssignments())
    assert assignments.all() == {}
    assignments.set("summarise", ["celery@a", "celery@b"])
    assignments.set("translate", [])
    assert assignments.all() == {"summarise": ["celery@a", "celery@b"], "translate": []}
    assignments.set("summarise", ["celery@b"])
    assignments.forget("translate")
    assignments.forget("never-placed")
    assert assignments.all() == {"summarise": ["celery@b"]}


def test_the_wake_key_of_a_task_lost_before_it_started_expires_on_its_own(redis_client: redis.Redis) -> None:
    requests = RedisAsyncRequests(redis_client, retention_s=RETENTION_S)
    queued(requests, "r1")  # the first queued request set it (its task was lost)
    assert 0 < redis_client.ttl(keys.async_wake("echo")) <= WAKE_TTL_S
