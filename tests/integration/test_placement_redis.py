"""Placement over Redis's job store and node registry keeps placement's contract (`tests/contracts/placement.py`),
run over Redis's parts and over the in-memory fakes (a parametrised fixture) on a real redis-server; and
what only Redis meets: records and heartbeats written by hand, unreadable.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import redis

from foundation.keys import NODES as NODES_KEY
from jobs.nodes.memory import MemoryNodes
from jobs.nodes.registry import NodeRegistry, Nodes
from jobs.placement.batch import Placement
from jobs.store import JobField, JobStorage, JobStore
from jobs.store.memory import MemoryJobStore
from jobs.transport.memory import MemoryJobQueues
from tests.contracts.placement import NODE_TTL_S, T0, DamageRecord, PlacementContract, submit

Backend = tuple[JobStorage, NodeRegistry, DamageRecord]


class TestPlacementOverRedisAndOverTheFakes(PlacementContract):
    @pytest.fixture(params=["redis", "memory"])
    def backend(self, request: pytest.FixtureRequest) -> Iterator[Backend]:
        if request.param == "memory":
            memory = MemoryJobStore()

            def damage_memory(job_id: str, text: str) -> None:
                memory.hash_of(job_id)[JobField.RECORD] = text

            yield memory, MemoryNodes(NODE_TTL_S, inflight=memory.inflight), damage_memory
        else:
            client: redis.Redis = request.getfixturevalue("redis_client")

            def damage_redis(job_id: str, text: str) -> None:
                client.hset(f"sluice:job:{job_id}", JobField.RECORD, text)

            yield JobStore(client), Nodes(client, NODE_TTL_S), damage_redis

    @pytest.fixture
    def store(self, backend: Backend) -> JobStorage:
        return backend[0]

    @pytest.fixture
    def nodes(self, backend: Backend) -> NodeRegistry:
        return backend[1]

    @pytest.fixture
    def damage_record(self, backend: Backend) -> DamageRecord:
        return backend[2]


@pytest.fixture
def store(redis_client: redis.Redis) -> JobStore:
    return JobStore(redis_client)


@pytest.fixture
def nodes(redis_client: redis.Redis) -> Nodes:
    return Nodes(redis_client, NODE_TTL_S)


@pytest.fixture
def placement(store: JobStore, nodes: Nodes) -> Placement:
    return Placement(MemoryJobQueues(), store, nodes)


def test_a_record_written_by_hand_with_a_bad_field_or_no_json_does_not_stop_reconcile(
    placement: Placement, store: JobStore, nodes: Nodes, redis_client: redis.Redis
) -> None:
    nodes.heartbeat("celery@a", ["cpu"], now=T0)
    submit(store, "a-bad")
    submit(store, "b-good")
    bad = json.loads(redis_client.hget("sluice:job:a-bad", "record"))
    redis_client.hset("sluice:job:a-bad", "record", json.dumps({**bad, "workers": "two"}))
    redis_client.hset("sluice:job:c-corrupt", mapping={"record": "{not json", "status": "status_running"})
    redis_client.sadd("sluice:jobs:active", "c-corrupt")

    placement.reconcile(now=T0)

    assert store.state("b-good").nodes == ["celery@a"]


def test_an_unreadable_heartbeat_is_ignored_and_reconcile_goes_on_with_the_other_nodes(
    placement: Placement, nodes: Nodes, redis_client: redis.Redis
) -> None:
    nodes.heartbeat("celery@a", ["cpu"], now=T0)
    redis_client.hset(NODES_KEY, "celery@garbled", "{not json")
    redis_client.hset(NODES_KEY, "celery@no-time", json.dumps({"queues": ["cpu"], "seen": "yesterday"}))

    assert placement.live_nodes(T0) == {"celery@a": ["cpu"]}
    placement.reconcile(now=T0)
