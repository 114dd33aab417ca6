"""The in-memory node registry keeps the node registry's contract (`tests/contracts/nodes.py`), sharing its
in-flight hashes with the in-memory batch ledger as Redis's registry shares them with its scripts.

The same contract runs against Redis's `Nodes` and this one in tests/integration/test_nodes_redis.py.
"""

from __future__ import annotations

import pytest

from jobs.memory_nodes import MemoryNodes
from jobs.store.memory import MemoryJobStore
from tests.contracts.nodes import NODE_TTL_S, NodeRegistryContract


class TestTheMemoryNodeRegistry(NodeRegistryContract):
    @pytest.fixture
    def store(self) -> MemoryJobStore:
        return MemoryJobStore()

    @pytest.fixture
    def nodes(self, store: MemoryJobStore) -> MemoryNodes:
        return MemoryNodes(NODE_TTL_S, inflight=store.inflight)
