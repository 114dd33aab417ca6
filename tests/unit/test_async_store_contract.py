"""The in-memory AsyncAPI request store and placement record keep their contracts
(`tests/contracts/async_store.py`, `tests/contracts/async_assignments.py`).

The same contracts run against Redis's `RedisAsyncRequests`, `RedisAsyncAssignments` and these in
tests/integration/test_async_store_redis.py.
"""

from __future__ import annotations

import pytest

from jobs.asyncapi.memory import MemoryAsyncAssignments, MemoryAsyncRequests
from jobs.asyncapi.request import AsyncRequest, PayloadKind, RequestStatus
from jobs.nodes.memory import MemoryNodes
from tests.contracts.async_assignments import AsyncAssignmentsContract
from tests.contracts.async_store import RETENTION_S, AsyncRequestStoreContract


class TestTheMemoryAsyncRequestStore(AsyncRequestStoreContract):
    @pytest.fixture
    def requests(self) -> MemoryAsyncRequests:
        return MemoryAsyncRequests(retention_s=RETENTION_S)

    @pytest.fixture
    def nodes(self, requests: MemoryAsyncRequests) -> MemoryNodes:
        return MemoryNodes(node_ttl_s=10, inflight=requests.inflight)


def test_each_in_memory_request_store_keeps_its_own_requests_and_counts() -> None:
    first, second = MemoryAsyncRequests(retention_s=RETENTION_S), MemoryAsyncRequests(retention_s=RETENTION_S)
    request = AsyncRequest("echo", "r1", RequestStatus.IN_QUEUE, PayloadKind.JSON, 1000.0, payload=b"{}")
    assert first.create(request, now=1000.0)
    assert first.get("echo", "r1") == request and second.get("echo", "r1") is None
    assert first.counts("echo", 1000.0).in_queue == 1 and second.counts("echo", 1000.0).in_queue == 0


class TestTheMemoryAsyncAssignments(AsyncAssignmentsContract):
    @pytest.fixture
    def assignments(self) -> MemoryAsyncAssignments:
        return MemoryAsyncAssignments()
