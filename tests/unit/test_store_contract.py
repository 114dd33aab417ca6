"""The in-memory job store keeps the job store's contract (`tests/contracts/job_store.py`), so fast tests
of the batch path, enqueueing and the API may use it in place of Redis.

The same contract runs against Redis's store and this one in tests/integration/test_store_redis.py.
"""

from __future__ import annotations

import pytest

from jobs.store.memory import MemoryJobStore
from tests.contracts.job_store import JobStoreContract


class TestTheMemoryJobStore(JobStoreContract):
    @pytest.fixture
    def store(self) -> MemoryJobStore:
        return MemoryJobStore()
