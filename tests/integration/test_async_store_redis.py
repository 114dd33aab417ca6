"""The AsyncAPI request store in Redis keeps the contract it shares with the in-memory store
(`tests/contracts/async_store.py`), run against both (a parametrised fixture) on a real redis-server,
and what only Redis has: keys that expire on their own.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis

from foundation import keys
from foundation.api_registry import ApiRegistry, RedisApiRegistry
from foundation.errors import ApiNotFound
from foundation.memory import MemoryApiRegistry
from jobs.asyncapi.memory import MemoryAsyncAssignments, MemoryAsyncRequests
from jobs.asyncapi.store import WAKE_TTL_S, AsyncRequestStore, RedisAsyncRequests, RouteChanged, Submitted
from jobs.nodes.memory import MemoryNodes
from jobs.nodes.registry import NodeRegistry, Nodes
from jobs.placement.asyncapi import AsyncAssignments, RedisAsyncAssignments
from jobs.transport.task_messages import QueuedMessage
from predictors_runtime.config import ApiConfig
from tests.contracts.async_assignments import AsyncAssignmentsContract
from tests.contracts.async_store import RETENTION_S, T0, AsyncRequestStoreContract, queued
from tests.contracts.async_store import request as contract_request


class TestTheAsyncRequestStoreInRedisAndInMemory(AsyncRequestStoreContract):
    @pytest.fixture(params=["redis", "memory"])
    def requests(self, request: pytest.FixtureRequest) -> AsyncRequestStore:
        if request.param == "memory":
            return MemoryAsyncRequests(retention_s=RETENTION_S)
        return RedisAsyncRequests(request.getfixturevalue("redis_client"), retention_s=RETENTION_S)

    @pytest.fixture
    def nodes(self, requests: AsyncRequestStore, request: pytest.FixtureRequest) -> NodeRegistry:
        if isinstance(requests, MemoryAsyncRequests):
            return MemoryNodes(node_ttl_s=10, inflight=requests.inflight)
        return Nodes(request.getfixturevalue("redis_client"), node_ttl_s=10)


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


def registry_and_store(backend: str, request: pytest.FixtureRequest) -> tuple[ApiRegistry, AsyncRequestStore]:
    """An API registry and a request store that checks submissions against it, in Redis or in memory."""
    if backend == "redis":
        client = request.getfixturevalue("redis_client")
        return RedisApiRegistry(client), RedisAsyncRequests(client, retention_s=RETENTION_S)
    registry = MemoryApiRegistry()
    return registry, MemoryAsyncRequests(retention_s=RETENTION_S, generation=registry.generation,
                                         registered=lambda name: any(a.name == name for a in registry.all()))


@pytest.mark.parametrize("backend", ["redis", "memory"])
def test_a_submitted_request_is_stored_and_offered_in_one_step_only_while_its_api_is_deployed(
        backend: str, request: pytest.FixtureRequest) -> None:
    registry, store = registry_and_store(backend, request)
    with pytest.raises(ApiNotFound):  # never deployed
        store.submit(contract_request("r0"), T0)
    registry.put(ApiConfig.model_validate({"name": "echo", "kind": "AsyncAPI", "predictor": {"path": "p.py"}}),
                 "bundle-1", now=T0)
    assert store.submit(contract_request("r1"), T0, queued=True) == Submitted(created=True, wake=True)
    assert store.submit(contract_request("r2"), T0, queued=True) == Submitted(created=True, wake=False)
    assert store.submit(contract_request("r1"), T0, queued=True) == Submitted(created=False)  # the same id
    assert store.submit(contract_request("r3"), T0) == Submitted(created=True)  # not offered to batches
    assert store.unstarted("echo", []) == ["r3"]  # no message for it on the queue: its caller is to send one
    assert [r for r, _ in store.claim("echo", "task-1", 5, T0 + 1)] == ["r1", "r2"]
    assert store.counts("echo", T0 + 1).in_queue == 1  # r3
    registry.delete("echo")
    with pytest.raises(ApiNotFound):  # deleted since its route was read
        store.submit(contract_request("r4"), T0)
    assert store.get("echo", "r4") is None


@pytest.mark.parametrize("backend", ["redis", "memory"])
def test_a_submitted_requests_task_message_is_queued_in_the_same_step_only_when_it_is_stored(
        backend: str, request: pytest.FixtureRequest) -> None:
    registry = MemoryApiRegistry()
    store: AsyncRequestStore
    if backend == "redis":
        client = request.getfixturevalue("redis_client")
        registry = RedisApiRegistry(client)  # type: ignore[assignment]
        store = RedisAsyncRequests(client, retention_s=RETENTION_S)
        pushed: Callable[[], list[bytes]] = lambda: list(client.lrange("async.echo", 0, -1))  # noqa: E731
    else:
        memory = store = MemoryAsyncRequests(retention_s=RETENTION_S,
                                             registered=lambda name: any(a.name == name for a in registry.all()))
        pushed = lambda: list(memory.pushed.get("async.echo", []))  # noqa: E731
    with pytest.raises(ApiNotFound):  # not deployed: neither stored nor queued
        store.submit(contract_request("r0"), T0, message=QueuedMessage("async.echo", b"task of r0"))
    registry.put(ApiConfig.model_validate({"name": "echo", "kind": "AsyncAPI", "predictor": {"path": "p.py"}}),
                 "bundle-1", now=T0)
    assert store.submit(contract_request("r1"), T0, message=QueuedMessage("async.echo", b"task of r1")).created
    assert not store.submit(contract_request("r1"), T0, message=QueuedMessage("async.echo", b"again")).created
    assert store.submit(contract_request("r2"), T0).created  # no message: its caller sends the task
    assert pushed() == [b"task of r1"]
    # Two unstarted and one message on the queue: the queue hands out its oldest first, so the oldest is
    # the one whose message is counted as gone.
    assert store.unstarted("echo", ["async.echo"]) == ["r1"]
    store.send(QueuedMessage("async.echo", b"task of the queued ones"))  # a task of no one request
    assert pushed() == [b"task of the queued ones", b"task of r1"]


class TestTheRedisAsyncAssignments(AsyncAssignmentsContract):
    @pytest.fixture
    def assignments(self, redis_client: redis.Redis) -> RedisAsyncAssignments:
        return RedisAsyncAssignments(redis_client)


@pytest.mark.parametrize("backend", ["redis", "memory"])
def test_a_submission_routed_at_an_older_generation_of_the_registry_is_refused_and_nothing_stored(
        backend: str, request: pytest.FixtureRequest) -> None:
    registry, store = registry_and_store(backend, request)
    echo = ApiConfig.model_validate({"name": "echo", "kind": "AsyncAPI", "predictor": {"path": "p.py"}})
    registry.put(echo, "bundle-1", now=T0)
    routed_at = registry.generation()
    message = QueuedMessage("async.echo", b"task")
    assert store.submit(contract_request("r1"), T0, message=message, generation=routed_at).created
    registry.put(echo, "bundle-2", now=T0)  # redeployed by another process: the route may have changed
    with pytest.raises(RouteChanged):
        store.submit(contract_request("r2"), T0, queued=True, message=message, generation=routed_at)
    assert store.get("echo", "r2") is None and store.counts("echo", T0).in_queue == 1
    assert store.submit(contract_request("r2"), T0, generation=registry.generation()).created  # read again
    assert store.submit(contract_request("r3"), T0).created  # a caller that does not ask is not checked
