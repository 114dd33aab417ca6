"""`sluice up`: the embedded stack starts with one command and Ctrl-C stops all of it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis
import requests

from sluice.embedded import free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _start_up(port: int, env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "sluice.cli", "up", "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
    )
    url = process.stdout.readline().strip()  # printed once everything is ready
    return process, url


def _children_of(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/stat").read_text().split()[2] if Path(f"/proc/{pid}/stat").exists() else "X"
    return status != "Z"


def test_sluice_up_without_a_redis_url_runs_a_private_redis_and_ctrl_c_stops_everything():
    env = {k: v for k, v in os.environ.items() if k != "SLUICE_REDIS_URL"}
    port = free_port()
    process, url = _start_up(port, env)
    try:
        assert url == f"http://127.0.0.1:{port}"
        health = requests.get(f"{url}/healthz", timeout=10).json()
        assert health["status"] == "ok" and len(health["worker_nodes"]) == 1
        children = _children_of(process.pid)
        names = {Path(f"/proc/{c}/comm").read_text().strip() for c in children}
        assert any("redis" in n for n in names), names
        assert len(children) == 5  # redis, api, the proxy, beat, one worker
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0, process.stderr.read()
    assert not any(_alive(c) for c in children)
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{url}/healthz", timeout=5)


def test_sluice_up_with_a_redis_url_uses_that_redis(redis_server):
    shared = redis_server.rsplit("/", 1)[0] + "/2"
    client = redis.Redis.from_url(shared)
    client.flushdb()
    port = free_port()
    process, url = _start_up(port, {**os.environ, "SLUICE_REDIS_URL": shared})
    try:
        assert url == f"http://127.0.0.1:{port}"
        assert client.hlen("sluice:nodes") == 1  # the worker registered in the given Redis
        names = {Path(f"/proc/{c}/comm").read_text().strip() for c in _children_of(process.pid)}
        assert not any("redis" in n for n in names), names
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=60)
    client.flushdb()
