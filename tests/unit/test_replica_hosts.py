"""`sluice replicas`: which realtime APIs a host serves (`--gpu`, `--cpu`, all), and the command
each launcher is started with. The manager doing so with real processes and Redis:
tests/integration/test_replica_hosts_processes.py.
"""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from foundation.api_registry import DeployedApi
from foundation.hosts import Resources, machine_resources
from predictors_runtime.config import ApiConfig
from sluice.cli import host_capacity, main
from sluice.replica_manager import launcher_argv, on_hardware


def _config(name: str, gpu: int = 0, kind: str = "RealtimeAPI") -> ApiConfig:
    return ApiConfig.from_dict({
        "name": name, "kind": kind, "predictor": {"path": "predictor.py"}, "compute": {"gpu": gpu},
    })


def _deployed(config: ApiConfig) -> DeployedApi:
    return DeployedApi(config.name, config.kind, config.to_dict(), "aa" * 32, config.queue, 0.0, [])


@pytest.mark.parametrize(("hardware", "served"),
                         [("gpu", ["on-gpu"]), ("cpu", ["on-cpu"]), (None, ["on-cpu", "on-gpu"])])
def test_a_host_selects_the_apis_of_its_hardware(hardware, served):
    apis = [_deployed(_config("on-cpu")), _deployed(_config("on-gpu", gpu=1))]
    assert [api.name for api in apis if on_hardware(hardware)(api)] == served


def test_unknown_hardware_is_refused():
    with pytest.raises(ValueError, match="cpu, gpu"):
        on_hardware("tpu")


# Managers starting and stopping launchers (real processes) for the APIs in a real Redis:
# tests/integration/test_replica_hosts_processes.py.


def test_each_launcher_is_told_the_address_the_proxy_reaches_this_host_at(tmp_path: Path):
    argv = launcher_argv("iris", 9100, host="0.0.0.0", advertise="10.0.0.7", api_url="http://proxy:8888",
                         state_dir=tmp_path, python="python3", placement_host="gpu-box/10.0.0.7/all")
    assert argv[:5] == ["python3", "-m", "sluice.cli", "serve", "iris"]
    # What `sluice serve` parses is what the manager meant, down to the placement host it announces.
    params = main.commands["serve"].make_context("serve", argv[4:]).params
    assert params == {"api": "iris", "port": 9100, "host": "0.0.0.0", "advertise": "10.0.0.7",
                      "api_url": "http://proxy:8888", "state_dir": tmp_path,
                      "placement_host": "gpu-box/10.0.0.7/all"}


def _capacity(command: str, flags: list[str]) -> tuple[Resources, str | None]:
    params = main.commands[command].make_context(command, flags).params
    return host_capacity(params["cpu"], params["mem"], params["gpu"], params["only"])


@pytest.mark.parametrize(("flags", "hardware"), [([], None), (["--gpu"], "gpu"), (["--cpu"], "cpu"),
                                                 (["--only", "gpu", "--gpu", "2"], "gpu")])
def test_the_replicas_command_takes_the_hardware_as_a_flag(flags, hardware):
    params = main.commands["replicas"].make_context("replicas", [*flags, "--host", "0.0.0.0"]).params
    assert _capacity("replicas", [*flags, "--host", "0.0.0.0"])[1] == hardware and params["host"] == "0.0.0.0"


@pytest.mark.parametrize("command", ["replicas", "up"])
def test_a_host_offers_the_room_its_flags_say_and_the_machine_s_for_the_rest(command):
    offers, hardware = _capacity(command, ["--cpu", "1500m", "--mem", "2Gi", "--gpu", "2"])
    assert offers == Resources(1500, 2 * 2**30, 2) and hardware is None
    found = machine_resources()
    assert _capacity(command, ["--mem", "1G"])[0] == Resources(found.cpu_m, 10**9, found.gpu)
    assert _capacity(command, ["--gpu"])[0] == found  # alone: only GPU APIs, every GPU found


@pytest.mark.parametrize("flags", [["--cpu", "lots"], ["--mem", "2 apples"], ["--gpu", "1.5"]])
def test_a_capacity_not_written_as_a_quantity_is_refused(flags):
    with pytest.raises(click.BadParameter):
        _capacity("replicas", flags)
