"""Fixtures shared by every test: a real redis-server on a free loopback port."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sluice.embedded import free_port  # noqa: E402


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory):
    """A private redis-server for the whole session; yields its URL."""
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed: `make test` installs it with apt")
    port = free_port()
    folder = tmp_path_factory.mktemp("redis")
    process = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder), "--save", "",
         "--appendonly", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    for _ in range(100):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    yield url
    process.terminate()
    process.wait(timeout=10)


@pytest.fixture
def redis_client(redis_server: str):
    """A clean database (number 1, apart from the stacks' database 0) for one test."""
    client = redis.Redis.from_url(redis_server.rsplit("/", 1)[0] + "/1")
    client.flushdb()
    yield client
    client.flushdb()
