"""A realtime API behind a real haproxy, protected by API keys because the operator said so
(`SLUICE_PROTECT_REALTIME=1`): a caller without the key never reaches a replica.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import requests

from foundation.api_registry import RedisApiRegistry
from foundation.settings import Settings
from predictors_runtime.config import ApiConfig
from sluice.embedded import free_port
from sluice.proxy import ProxyController
from tests.integration.test_proxy import Backend, Launchers, RunningProxy, tagged, wait_for

pytestmark = pytest.mark.integration

KEY = "k-6d0e2b9a51f34c88"


@pytest.fixture(scope="module")
def backends(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Backend]]:
    folder = tmp_path_factory.mktemp("proxy-auth-backends")
    started = {name: Backend(name, folder) for name in ("r1", "management")}
    try:
        for backend in started.values():
            wait_for(lambda backend=backend: backend.ready() or backend.process.poll() is not None, 60,
                     f"gunicorn {backend.name}")
            assert backend.process.poll() is None, (folder / f"{backend.name}.log").read_text()
        yield started
    finally:
        for backend in started.values():
            backend.stop()


@pytest.fixture
def protected_proxy(redis_client: redis.Redis, backends: dict[str, Backend], tmp_path: Path) -> Iterator[RunningProxy]:
    settings = Settings.from_env({"SLUICE_API_KEYS": KEY, "SLUICE_PROTECT_REALTIME": "1"})
    controller = ProxyController(redis_client, port=free_port(), management=backends["management"].address,
                                 state_dir=tmp_path / "proxy", settings=settings)
    running = RunningProxy(controller).start()
    try:
        yield running
    finally:
        running.stop()


def test_a_protected_realtime_api_answers_401_without_the_key_and_serves_with_it(
        protected_proxy, redis_client, backends):
    RedisApiRegistry(redis_client).put(ApiConfig.from_dict(
        {"name": "ap", "kind": "RealtimeAPI", "predictor": {"path": "predictor.py"}}), "b1")
    launchers = Launchers(redis_client)
    try:
        launchers.add("ap-1", "ap", backends["r1"])
        protected_proxy.settle_on("ap-1")
        url = f"{protected_proxy.url}/ap"

        refused_tag = uuid.uuid4().hex
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {KEY}"}):
            answer = requests.post(url, params={"tag": refused_tag}, json={"n": 1}, headers=headers, timeout=10)
            assert answer.status_code == 401, headers
            assert answer.json()["kind"] == "unauthorized"
            assert answer.headers["WWW-Authenticate"] == "Bearer"
            assert answer.headers["X-Request-ID"]

        for authorization in (f"Bearer {KEY}", f"bearer {KEY}"):
            answer = requests.post(url, json={"n": 1}, headers={"Authorization": authorization}, timeout=10)
            assert answer.status_code == 200, answer.text
            assert answer.json()["server"] == "r1"
        assert tagged(backends["r1"], refused_tag) == []  # refused at the proxy, never run
    finally:
        launchers.close()
