"""`sluice replicas`: a host's manager starts a launcher for each realtime API of its hardware
(`--gpu`, `--cpu`, all), and stops it when the API moves to other hardware.

Redis is real and the launchers are real processes (`sleep` stands in for `sluice serve`). The
selection and the launchers' command are tested fast in tests/unit/test_replica_hosts.py.
"""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from foundation.api_registry import ApiRegistry, RedisApiRegistry
from sluice.replica_manager import ReplicaManager, on_hardware
from tests.unit.test_replica_hosts import _config

pytestmark = pytest.mark.integration


class Launchers:
    """Starts a stand-in launcher per API and remembers which it started."""

    def __init__(self) -> None:
        self.started: list[str] = []

    def spawn(self, name: str, port: int) -> subprocess.Popen:
        self.started.append(name)
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)


@pytest.fixture
def registry(redis_client) -> ApiRegistry:
    registry = RedisApiRegistry(redis_client)
    registry.put(_config("on-cpu"), "aa" * 32)
    registry.put(_config("on-gpu", gpu=1), "aa" * 32)
    registry.put(_config("jobs", gpu=1, kind="BatchAPI"), "aa" * 32)
    return registry


@pytest.mark.parametrize(("hardware", "served"),
                         [("gpu", ["on-gpu"]), ("cpu", ["on-cpu"]), (None, ["on-cpu", "on-gpu"])])
def test_a_host_serves_the_realtime_apis_of_its_hardware(registry, hardware, served):
    launchers = Launchers()
    manager = ReplicaManager(registry, launchers.spawn, select=on_hardware(hardware))
    try:
        manager.step(100.0)
        assert sorted(manager.launchers) == served
    finally:
        manager.stop(grace=5)


def test_an_api_redeployed_for_a_gpu_leaves_the_cpu_host_and_is_not_started_there_again(registry):
    launchers = Launchers()
    manager = ReplicaManager(registry, launchers.spawn, select=on_hardware("cpu"))
    try:
        manager.step(100.0)
        launcher = manager.launchers["on-cpu"]

        registry.put(_config("on-cpu", gpu=1), "bb" * 32)
        manager.step(101.0)
        # SIGTERM, not a kill: a real launcher drains its replica before it exits.
        assert launcher.process.wait(timeout=30) == -signal.SIGTERM
        manager.step(102.0)
        manager.step(103.0)
        assert manager.launchers == {} and launchers.started == ["on-cpu"]

        registry.put(_config("on-cpu"), "cc" * 32)  # and back to the CPU
        manager.step(104.0)
        assert sorted(manager.launchers) == ["on-cpu"] and launchers.started == ["on-cpu", "on-cpu"]
    finally:
        manager.stop(grace=5)
