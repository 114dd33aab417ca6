"""The Redis users per role that docs/production.md describes (docker/redis-users.acl), loaded by a
real redis-server: each role may do what it needs, the proxy and replica hosts only under
`sluice:*` (never a queue), and none may run an administrative command."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from sluice.embedded import free_port
from testbed.waiting import wait_for

pytestmark = pytest.mark.integration

ACL_FILE = Path(__file__).resolve().parents[2] / "docker" / "redis-users.acl"
SCRIPT = "return redis.call('INCR', KEYS[1])"


@pytest.fixture(scope="module")
def port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    port, folder = free_port(), tmp_path_factory.mktemp("redis-acl")
    process = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder),
                                "--save", "", "--aclfile", str(ACL_FILE)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    wait_for(lambda: _answers(port), 15, "redis-server with the ACL file")
    yield port
    process.terminate()
    process.wait(timeout=10)


def _answers(port: int) -> bool:
    try:
        return bool(as_user(port, "sluice-api").ping())
    except redis.RedisError:
        return False


def as_user(port: int, user: str) -> redis.Redis:
    return redis.Redis(port=port, username=user, password=f"change-me-{user.removeprefix('sluice-')}",
                       socket_timeout=2)


@pytest.mark.parametrize("user", ["sluice-api", "sluice-workers", "sluice-beat"])
def test_the_roles_that_move_work_reach_the_queues_and_run_scripts(port: int, user: str) -> None:
    client = as_user(port, user)
    client.lpush("job.0123", "message")
    assert client.rpop("job.0123") == b"message"
    assert client.eval(SCRIPT, 1, f"sluice:test:{user}") >= 1
    assert "connected_slaves" in client.info("replication")
    with pytest.raises(redis.exceptions.NoPermissionError):
        client.config_set("appendonly", "no")
    with pytest.raises(redis.exceptions.NoPermissionError):
        client.flushall()


def test_the_api_may_wait_for_replicas(port: int) -> None:
    assert as_user(port, "sluice-api").wait(0, 10) == 0


@pytest.mark.parametrize("user", ["sluice-proxy", "sluice-replicas"])
def test_the_proxy_and_replica_hosts_keep_to_sluices_own_keys(port: int, user: str) -> None:
    client = as_user(port, user)
    client.hset("sluice:replicas", "r-1", "{}")
    assert client.eval(SCRIPT, 1, f"sluice:test:{user}") >= 1
    with pytest.raises(redis.exceptions.NoPermissionError):
        client.rpop("job.0123")  # a queued job's messages are not a replica host's to take
    with pytest.raises(redis.exceptions.NoPermissionError):
        client.eval(SCRIPT, 1, "cpu")


def test_the_default_user_is_off(port: int) -> None:
    with pytest.raises(redis.exceptions.AuthenticationError):
        redis.Redis(port=port, socket_timeout=2).ping()
