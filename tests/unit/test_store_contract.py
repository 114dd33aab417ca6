"""The in-memory job store keeps the job store's contract (`tests/contracts/job_store.py`), so fast tests
of the batch path, enqueueing and the API may use it in place of Redis.

The same contract runs against Redis's store and this one in tests/integration/test_store_redis.py.
"""

from __future__ import annotations

import pytest

from foundation.errors import JobNotFound
from jobs.batch.job import Job, JobStatus
from jobs.store.memory import MemoryJobStore
from tests.contracts.job_store import JobStoreContract


class TestTheMemoryJobStore(JobStoreContract):
    @pytest.fixture
    def store(self) -> MemoryJobStore:
        return MemoryJobStore()


def test_each_in_memory_store_keeps_its_own_jobs() -> None:
    """A fast test's store starts empty and never sees another test's jobs (Redis's are keyed apart)."""
    first, second = MemoryJobStore(), MemoryJobStore()
    job = Job(job_id="job-own", api_name="iris", workers=1, config={}, timeout=None, total_batch_count=1,
              start_time=1_700_000_000.0)
    first.create(job, JobStatus.RUNNING)
    assert first.list_ids("iris") == ["job-own"]
    assert second.list_ids("iris") == []
    with pytest.raises(JobNotFound):
        second.state("job-own")
