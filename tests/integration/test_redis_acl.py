"""The Redis users per role that docs/production.md describes (docker/redis-users.acl), loaded by a
real redis-server: each role may do what it needs, the proxy and replica hosts only under
`sluice:*` (never a queue), and none may run an administrative command."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from sluice.embedded import Stack, free_port
from testbed.waiting import wait_for

from .conftest import FAST_LOOPS, ROOM, closing_client, write_project
from .test_realtime import write_realtime_project

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


def test_a_stack_runs_a_job_and_serves_a_realtime_api_with_each_role_as_its_own_user(port: int,
                                                                                     tmp_path: Path) -> None:
    """The API, beat and worker nodes as `sluice-workers` (no administrative command), a replica
    host as `sluice-replicas` and a proxy as `sluice-proxy` (Sluice's own keys only): a batch job runs
    and a realtime API placed on that host answers through that proxy."""
    url = "redis://{user}:change-me-{role}@127.0.0.1:" + f"{port}/0"
    stack = Stack(port=free_port(), workers=1, offers=ROOM, realtime=False, data_dir=tmp_path / "stack",
                  redis_url=url.format(user="sluice-workers", role="workers"), env=FAST_LOOPS).start()
    role_env = {**os.environ, **FAST_LOOPS, "SLUICE_STORAGE": str(tmp_path / "stack" / "storage")}
    children: list[subprocess.Popen[bytes]] = []
    try:
        client = closing_client(stack.url)
        client.deploy(write_project(tmp_path / "acl-job", "acl-job", {"events": str(tmp_path / "events.jsonl")}))
        spec = client.submit("acl-job", [1, 2, 3, 4], batch_size=2)
        assert wait_for(lambda: _ended(client, "acl-job", spec["job_id"]), 120, "the job") == "status_succeeded"

        proxy_port = free_port()
        children.append(subprocess.Popen(
            [sys.executable, "-m", "sluice.cli", "proxy", "--port", str(proxy_port),
             "--management", stack.management_url.removeprefix("http://"), "--state-dir", str(tmp_path / "proxy")],
            env={**role_env, "SLUICE_REDIS_URL": url.format(user="sluice-proxy", role="proxy")},
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True))
        children.append(subprocess.Popen(
            [sys.executable, "-m", "sluice.cli", "replicas", "--host-id", "acl-host", "--cpu", "2", "--mem", "4Gi",
             "--gpu", "0", "--api-url", f"http://127.0.0.1:{proxy_port}", "--state-dir", str(tmp_path / "replicas")],
            env={**role_env, "SLUICE_REDIS_URL": url.format(user="sluice-replicas", role="replicas"),
                 "SLUICE_CACHE_DIR": str(tmp_path / "replica-cache")},
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True))
        client.deploy(write_realtime_project(tmp_path / "acl-greeter", "acl-greeter"))
        client.wait_ready("acl-greeter", timeout=120)
        through_proxy = closing_client(f"http://127.0.0.1:{proxy_port}")
        answered = wait_for(lambda: _predicted(through_proxy), 60, "an answer through the proxy user's proxy")
        assert answered["echo"] == {"via": "acl"}
        assert [r["id"] for r in client.api("acl-greeter")["replicas"]]  # announced by the replicas user
    finally:
        for child in children:
            child.send_signal(signal.SIGTERM)
        for child in children:
            child.wait(timeout=60)
        stack.stop()


def _ended(client, api: str, job_id: str) -> str | None:
    status = str(client.job(api, job_id)["status"])
    return None if status in ("status_enqueuing", "status_running") else status


def _predicted(client) -> dict | None:
    try:
        return client.predict("acl-greeter", {"via": "acl"})
    except Exception:  # noqa: BLE001 - until the proxy routes the replica
        return None
