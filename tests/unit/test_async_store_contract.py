"""The in-memory AsyncAPI request store keeps the store's contract (`tests/contracts/async_store.py`).

The same contract runs against Redis's `RedisAsyncRequests` and this one in
tests/integration/test_async_store_redis.py.
"""

from __future__ import annotations

import pytest

from jobs.memory_async import MemoryAsyncRequests
from tests.contracts.async_store import RETENTION_S, AsyncRequestStoreContract


class TestTheMemoryAsyncRequestStore(AsyncRequestStoreContract):
    @pytest.fixture
    def requests(self) -> MemoryAsyncRequests:
        return MemoryAsyncRequests(retention_s=RETENTION_S)
