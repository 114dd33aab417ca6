"""The node registry in Redis: the contract it shares with the in-memory registry (`tests/contracts/nodes.py`),
run against both (a parametrised fixture) on a real redis-server, and what only Redis meets: a
heartbeat another version (or a damaged write) left unreadable.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import redis

from foundation.keys import NODES as NODES_KEY
from jobs.nodes.memory import MemoryNodes
from jobs.nodes.registry import NodeRegistry, Nodes
from jobs.store import JobStorage, JobStore
from jobs.store.memory import MemoryJobStore
from tests.contracts.nodes import NODE_TTL_S, T0, NodeRegistryContract


class TestTheNodeRegistryInRedisAndInMemory(NodeRegistryContract):
    @pytest.fixture(params=["redis", "memory"])
    def backend(self, request: pytest.FixtureRequest) -> Iterator[tuple[NodeRegistry, JobStorage]]:
        if request.param == "memory":
            store = MemoryJobStore()
            yield MemoryNodes(NODE_TTL_S, inflight=store.inflight), store
        else:
            client: redis.Redis = request.getfixturevalue("redis_client")
            yield Nodes(client, NODE_TTL_S), JobStore(client)

    @pytest.fixture
    def nodes(self, backend: tuple[NodeRegistry, JobStorage]) -> NodeRegistry:
        return backend[0]

    @pytest.fixture
    def store(self, backend: tuple[NodeRegistry, JobStorage]) -> JobStorage:
        return backend[1]


def test_a_heartbeat_is_kept_as_json_under_the_nodes_key(redis_client: redis.Redis) -> None:
    Nodes(redis_client, NODE_TTL_S).heartbeat("celery@a", ["job.x", "cpu"], now=T0)

    assert json.loads(redis_client.hget(NODES_KEY, "celery@a")) == {"queues": ["cpu"], "seen": T0}


def test_an_unreadable_heartbeat_is_ignored_and_the_other_nodes_stay_live(redis_client: redis.Redis) -> None:
    nodes = Nodes(redis_client, NODE_TTL_S)
    nodes.heartbeat("celery@a", ["cpu"], now=T0)
    redis_client.hset(NODES_KEY, "celery@garbled", "{not json")
    redis_client.hset(NODES_KEY, "celery@no-time", json.dumps({"queues": ["cpu"], "seen": "yesterday"}))

    assert nodes.live(T0) == {"celery@a": ["cpu"]}
