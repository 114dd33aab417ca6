"""The in-memory node registry keeps the node registry's contract (`tests/contracts/nodes.py`), sharing its
in-flight hashes with the in-memory batch ledger as Redis's registry shares them with its scripts.

The same contract runs against Redis's `Nodes` and this one in tests/integration/test_nodes_redis.py.
"""

from __future__ import annotations

import pytest

from jobs.nodes.memory import MemoryNodes
from jobs.store.memory import MemoryJobStore
from jobs.transport.delivery import Delivery
from tests.contracts.nodes import NODE_TTL_S, NodeRegistryContract, running_job


class TestTheMemoryNodeRegistry(NodeRegistryContract):
    @pytest.fixture
    def store(self) -> MemoryJobStore:
        return MemoryJobStore()

    @pytest.fixture
    def nodes(self, store: MemoryJobStore) -> MemoryNodes:
        return MemoryNodes(NODE_TTL_S, inflight=store.inflight)


def test_registries_share_in_flight_entries_only_through_the_store_they_are_given() -> None:
    """As Redis's registry reads the hashes its store's scripts write: one store, one view."""
    store, other_store = MemoryJobStore(), MemoryJobStore()
    job = running_job(store, "job-shared")
    store.begin_batch(job.job_id, 0, Delivery("busy@host", "task-1"))
    assert MemoryNodes(NODE_TTL_S, inflight=store.inflight).inflight("busy@host") == {"task-1": "job-shared:0"}
    assert MemoryNodes(NODE_TTL_S, inflight=other_store.inflight).inflight("busy@host") == {}
