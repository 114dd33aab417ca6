"""`sluice replicas`: which realtime APIs a host serves (`--gpu`, `--cpu`, all), and the command
each launcher is started with.

Redis is real and the launchers are real processes (`sleep` stands in for `sluice serve`).
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from foundation.api_registry import ApiRegistry
from predictors_runtime.config import ApiConfig
from sluice.cli import main
from sluice.replica_manager import ReplicaManager, launcher_argv, on_hardware


def _config(name: str, gpu: int = 0, kind: str = "RealtimeAPI") -> ApiConfig:
    return ApiConfig.from_dict({
        "name": name, "kind": kind, "predictor": {"path": "predictor.py"}, "compute": {"gpu": gpu},
    })


class Launchers:
    """Starts a stand-in launcher per API and remembers which it started."""

    def __init__(self) -> None:
        self.started: list[str] = []

    def spawn(self, name: str, port: int) -> subprocess.Popen:
        self.started.append(name)
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)


@pytest.fixture
def registry(redis_client) -> ApiRegistry:
    registry = ApiRegistry(redis_client)
    registry.put(_config("on-cpu"), "aa" * 32)
    registry.put(_config("on-gpu", gpu=1), "aa" * 32)
    registry.put(_config("jobs", gpu=1, kind="BatchAPI"), "aa" * 32)
    return registry


@pytest.mark.parametrize(("hardware", "served"), [("gpu", ["on-gpu"]), ("cpu", ["on-cpu"]), (None, ["on-cpu", "on-gpu"])])
def test_a_host_serves_the_realtime_apis_of_its_hardware(registry, hardware, served):
    launchers = Launchers()
    manager = ReplicaManager(registry, launchers.spawn, select=on_hardware(hardware))
    try:
        manager.step(100.0)
        assert sorted(manager.launchers) == served
    finally:
        manager.stop(grace=5)


def test_unknown_hardware_is_refused():
    with pytest.raises(ValueError, match="cpu, gpu"):
        on_hardware("tpu")


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


def test_each_launcher_is_told_the_address_the_proxy_reaches_this_host_at(tmp_path: Path):
    argv = launcher_argv("iris", 9100, host="0.0.0.0", advertise="10.0.0.7", api_url="http://proxy:8888",
                         state_dir=tmp_path, python="python3")
    assert argv[:5] == ["python3", "-m", "sluice.cli", "serve", "iris"]
    # What `sluice serve` parses is what the manager meant.
    params = main.commands["serve"].make_context("serve", argv[4:]).params
    assert params == {"api": "iris", "port": 9100, "host": "0.0.0.0", "advertise": "10.0.0.7",
                      "api_url": "http://proxy:8888", "state_dir": tmp_path}


@pytest.mark.parametrize(("flags", "hardware"), [([], None), (["--gpu"], "gpu"), (["--cpu"], "cpu")])
def test_the_replicas_command_takes_the_hardware_as_a_flag(flags, hardware):
    params = main.commands["replicas"].make_context("replicas", [*flags, "--host", "0.0.0.0"]).params
    assert params["hardware"] == hardware and params["host"] == "0.0.0.0"
