"""`sluice replicas`: which realtime APIs a host serves (`--gpu`, `--cpu`, all), and the command
each launcher is started with. The manager doing so with real processes and Redis:
tests/integration/test_replica_hosts_processes.py.
"""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from foundation.api_registry import DeployedApi
from foundation.hosts import HOST_TTL_S, Resources, machine_resources
from foundation.memory import MemoryHostDirectory, MemoryReplicaAssignments
from foundation.settings import Settings
from predictors_runtime.config import ApiConfig
from sluice.cli import host_capacity, main
from sluice.replica_manager import HostAgent, host_heartbeat_s, launcher_argv, on_hardware


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


def test_the_host_ttl_is_a_setting_of_15_seconds_by_default() -> None:
    assert Settings.from_env({}).host_ttl_s == HOST_TTL_S == 15
    assert Settings.from_env({"SLUICE_HOST_TTL": "4"}).host_ttl_s == 4


def test_a_host_announces_itself_four_times_per_ttl_when_the_ttl_is_short() -> None:
    """Every 2 s under the default TTL; under a TTL shortened to 4 s, every second, so one missed
    heartbeat on a loaded machine does not lose the host its replicas."""
    assert host_heartbeat_s(HOST_TTL_S) == 2
    assert host_heartbeat_s(4) == 1
    hosts = MemoryHostDirectory()
    agent = HostAgent(hosts, MemoryReplicaAssignments(), host_id="h", address="10.0.0.1", offers=Resources(200),
                      hardware=None, every_s=host_heartbeat_s(4))
    seen = []
    for now in (100.0, 100.5, 101.0, 101.5, 102.0):
        agent.heartbeat(now)
        seen.append(hosts.all()[0].seen)
    assert seen == [100.0, 100.0, 101.0, 101.0, 102.0]
