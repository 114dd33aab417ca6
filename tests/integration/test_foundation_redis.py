"""The foundation's Redis collaborators keep their contracts (`tests/contracts/`) on a real
redis-server, and what only Redis does: expiry, trimming by stream node, records written by other
versions, log shipping that makes no call until it flushes.

The same contracts run against the in-memory fakes in tests/unit/test_foundation_fakes.py.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Iterator

import pytest
import redis

from foundation import keys
from foundation.api_registry import RedisApiRegistry
from foundation.figure_store import RedisFigureStore
from foundation.hosts import RedisHostDirectory
from foundation.log_streams import LogStreams, RedisLogStreams, StreamLogHandler, api_stream, job_stream
from foundation.proxy_load import RedisProxyLoadBook
from foundation.proxy_registry import RedisProxyRegistry
from foundation.redis_clients import BACKGROUND, client
from foundation.replica_directory import RedisReplicaDirectory
from foundation.replica_placement import RedisReplicaAssignments
from foundation.replica_scale import RedisScaleBook
from jobs.nodes.worker_hosts import RedisWorkerHosts
from sluice.embedded import free_port
from tests.contracts.api_registry import ApiRegistryContract
from tests.contracts.figure_store import FigureStoreContract
from tests.contracts.hosts import HostDirectoryContract
from tests.contracts.log_streams import LogStreamsContract
from tests.contracts.proxy_load import ProxyLoadBookContract
from tests.contracts.proxy_registry import ProxyRegistryContract
from tests.contracts.replica_assignments import ReplicaAssignmentsContract
from tests.contracts.replica_directory import NOW, ReplicaDirectoryContract, record
from tests.contracts.replica_scale import ScaleBookContract
from tests.contracts.worker_hosts import WorkerHostsContract

NEVER_S = 3600.0  # a flush interval no test outlives: only an explicit flush (or a batch's end) ships


@pytest.fixture
def nowhere() -> redis.Redis:
    """A client of a Redis that is not there (connection refused at once; no retries)."""
    return client(f"redis://127.0.0.1:{free_port()}/0", BACKGROUND)


class TestTheRedisApiRegistry(ApiRegistryContract):
    @pytest.fixture
    def registry(self, redis_client: redis.Redis) -> RedisApiRegistry:
        return RedisApiRegistry(redis_client)

    @pytest.fixture
    def unreachable_registry(self, nowhere: redis.Redis) -> RedisApiRegistry:
        return RedisApiRegistry(nowhere)


class TestTheRedisReplicaDirectory(ReplicaDirectoryContract):
    @pytest.fixture
    def directory(self, redis_client: redis.Redis) -> RedisReplicaDirectory:
        return RedisReplicaDirectory(redis_client)

    @pytest.fixture
    def unreachable_directory(self, nowhere: redis.Redis) -> RedisReplicaDirectory:
        return RedisReplicaDirectory(nowhere)


class TestTheRedisLogStreams(LogStreamsContract):
    @pytest.fixture
    def make_streams(self, redis_client: redis.Redis) -> Callable[..., LogStreams]:
        return lambda **bounds: RedisLogStreams(redis_client, **bounds)

    @pytest.fixture
    def unreachable_streams(self, nowhere: redis.Redis) -> RedisLogStreams:
        return RedisLogStreams(nowhere)


class TestTheRedisFigureStore(FigureStoreContract):
    @pytest.fixture
    def store(self, redis_client: redis.Redis) -> RedisFigureStore:
        return RedisFigureStore(redis_client)

    @pytest.fixture
    def unreachable_store(self, nowhere: redis.Redis) -> RedisFigureStore:
        return RedisFigureStore(nowhere)


# -- what only Redis does ----------------------------------------------------------------------------
def test_a_replica_record_of_another_sluice_version_is_left_out(redis_client: redis.Redis) -> None:
    directory = RedisReplicaDirectory(redis_client)
    directory.announce(record("iris-1"))
    redis_client.hset(keys.REPLICAS, "from-the-future", json.dumps({"replica_id": "from-the-future"}))
    redis_client.hset(keys.REPLICAS, "garbled", "{not json")

    assert [r.replica_id for r in directory.all()] == ["iris-1"]
    assert [r.replica_id for r in directory.routable(NOW)] == ["iris-1"]


def test_a_stream_expires_its_retention_after_its_last_line(redis_client: redis.Redis) -> None:
    streams = RedisLogStreams(redis_client, max_lines=100, retention_s=120)
    stream = api_stream("iris")

    streams.append({stream: ['{"message": "hello"}']})

    assert 0 < redis_client.ttl(stream) <= 120


@pytest.fixture
def logger() -> Iterator[logging.Logger]:
    """A logger of the test's own (not the root's), as a worker's root logger would be."""
    private = logging.getLogger(f"test.foundation_redis.{uuid.uuid4().hex}")
    private.propagate = False
    private.setLevel(logging.DEBUG)
    yield private
    for handler in list(private.handlers):
        private.removeHandler(handler)
        handler.close()


def commands_processed(client: redis.Redis) -> int:
    return int(client.info("stats")["total_commands_processed"])


def test_logging_makes_no_redis_call_until_the_lines_are_flushed_in_one_go(
    redis_client: redis.Redis, logger: logging.Logger,
) -> None:
    streams = RedisLogStreams(redis_client, max_lines=10_000, retention_s=3600)
    handler = StreamLogHandler(streams, flush_interval_s=NEVER_S)
    logger.addHandler(handler)
    before = commands_processed(redis_client)

    with handler.capturing(job_stream("busy")):
        for n in range(200):
            logger.info("line %d", n)
        during = commands_processed(redis_client)
        handler.flush()

    assert during - before == 1  # the INFO call that counted them
    assert len(streams.read(job_stream("busy")).lines) == 200


def test_more_lines_between_two_flushes_than_a_stream_keeps_leave_its_newest_lines_without_a_gap(
    redis_client: redis.Redis, logger: logging.Logger,
) -> None:
    streams = RedisLogStreams(redis_client, max_lines=50, retention_s=3600)
    handler = StreamLogHandler(streams, flush_interval_s=NEVER_S)
    logger.addHandler(handler)
    with handler.capturing_job("flood"):
        logger.info("an older line")
        handler.flush()
        for n in range(1000):
            logger.info("line", extra={"n": n})
        handler.flush()
        logger.info("line", extra={"n": 1000})
        handler.flush()

    kept = streams.read(job_stream("flood")).lines

    assert [line["n"] for line in kept] == list(range(1000 - 50, 1001))


class TestTheRedisReplicaAssignments(ReplicaAssignmentsContract):
    @pytest.fixture
    def assignments(self, redis_client: redis.Redis) -> RedisReplicaAssignments:
        return RedisReplicaAssignments(redis_client)


class TestTheRedisScaleBook(ScaleBookContract):
    @pytest.fixture
    def book(self, redis_client: redis.Redis) -> RedisScaleBook:
        return RedisScaleBook(redis_client)


class TestTheRedisProxyLoadBook(ProxyLoadBookContract):
    @pytest.fixture
    def loads(self, redis_client: redis.Redis) -> RedisProxyLoadBook:
        return RedisProxyLoadBook(redis_client)


class TestTheRedisHostDirectory(HostDirectoryContract):
    @pytest.fixture
    def hosts(self, redis_client: redis.Redis) -> RedisHostDirectory:
        return RedisHostDirectory(redis_client)


class TestRedisWorkerHostsKeepsTheContract(WorkerHostsContract):
    @pytest.fixture
    def worker_hosts(self, redis_client: redis.Redis) -> RedisWorkerHosts:
        return RedisWorkerHosts(redis_client)


class TestTheRedisProxyRegistry(ProxyRegistryContract):
    @pytest.fixture
    def proxies(self, redis_client: redis.Redis) -> RedisProxyRegistry:
        return RedisProxyRegistry(redis_client)


def test_an_unreadable_proxy_record_is_not_live_and_is_forgotten(redis_client: redis.Redis) -> None:
    redis_client.hset(keys.PROXIES, "garbled", b"{not json")
    proxies = RedisProxyRegistry(redis_client)
    assert proxies.live(0.0) == []
    proxies.forget_silent(0.0)
    assert redis_client.hlen(keys.PROXIES) == 0
