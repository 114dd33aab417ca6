"""`sluice replicas`: a host's manager starts a launcher for each realtime API of its hardware
(`--gpu`, `--cpu`, all), and stops it when the API moves to other hardware; with placement, as
many launchers of each API as the host is assigned, each on ports of its own, and one fewer
assigned stops the newest with SIGTERM (a real launcher drains first).

Redis is real and the launchers are real processes (`sleep` stands in for `sluice serve`). The
selection and the launchers' command are tested fast in tests/unit/test_replica_hosts.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from foundation.api_registry import ApiRegistry, RedisApiRegistry
from foundation.devices import NEURON, HostDevices, host_cores, host_gpus
from foundation.hosts import HOST_TTL_S, RedisHostDirectory, Resources
from foundation.replica_placement import PlacedReplicas, RedisReplicaAssignments, on_host
from foundation.replica_scale import RedisScaleBook
from jobs.placement.realtime import RealtimePlacement
from predictors_runtime.config import ApiConfig
from sluice.replica_manager import ReplicaManager, on_hardware
from testbed.waiting import wait_for
from tests.unit.test_replica_hosts import _config

pytestmark = pytest.mark.integration


class Launchers:
    """Starts a stand-in launcher per API and remembers which it started, and with which devices."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.devices: dict[int, dict[str, str]] = {}  # launcher pid -> the devices it was given

    def spawn(self, name: str, port: int, devices: dict[str, str]) -> subprocess.Popen:
        self.started.append(name)
        process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
        self.devices[process.pid] = dict(devices)
        return process


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
        assert sorted(api for api, _ in manager.launchers) == served
    finally:
        manager.stop(grace=5)


def test_an_api_redeployed_for_a_gpu_leaves_the_cpu_host_and_is_not_started_there_again(registry):
    launchers = Launchers()
    manager = ReplicaManager(registry, launchers.spawn, select=on_hardware("cpu"))
    try:
        manager.step(100.0)
        [launcher] = manager.running("on-cpu")

        registry.put(_config("on-cpu", gpu=1), "bb" * 32)
        manager.step(101.0)
        # SIGTERM, not a kill: a real launcher drains its replica before it exits.
        assert launcher.process.wait(timeout=30) == -signal.SIGTERM
        manager.step(102.0)
        manager.step(103.0)
        assert manager.launchers == {} and launchers.started == ["on-cpu"]

        registry.put(_config("on-cpu"), "cc" * 32)  # and back to the CPU
        manager.step(104.0)
        assert [api for api, _ in manager.launchers] == ["on-cpu"] and launchers.started == ["on-cpu", "on-cpu"]
    finally:
        manager.stop(grace=5)


def test_a_host_runs_as_many_launchers_as_it_is_assigned_and_stops_the_newest_when_fewer(registry, redis_client):
    placement = RedisReplicaAssignments(redis_client)
    placement.set("on-cpu", PlacedReplicas({"this-host": 1, "other-host": 2}, desired=3))
    launchers = Launchers()
    manager = ReplicaManager(registry, launchers.spawn, assigned=lambda: on_host(placement.all(), "this-host"))
    try:
        manager.step(100.0)
        assert [launcher.api for launcher in manager.launchers.values()] == ["on-cpu"]

        placement.set("on-cpu", PlacedReplicas({"this-host": 3}, desired=3))
        manager.step(101.0)
        running = manager.running("on-cpu")
        assert len(running) == 3 and launchers.started == ["on-cpu"] * 3
        ports = {p + i for launcher in running for p in [launcher.port] for i in (0, 1)}
        assert len(ports) == 6  # each launcher its own pair: P for a replica, P+1 for its redeploy

        placement.set("on-cpu", PlacedReplicas({"this-host": 1}, desired=1))
        manager.step(102.0)
        first, *newest = running
        for launcher in newest:  # SIGTERM: a real launcher leaves the proxy and drains before it exits
            assert launcher.process.wait(timeout=30) == -signal.SIGTERM
        manager.step(103.0)
        manager.step(104.0)
        assert manager.running("on-cpu") == [first] and first.process.poll() is None
        assert len(launchers.started) == 3  # the stopped ones are not started again
    finally:
        manager.stop(grace=5)


def test_a_replica_host_killed_has_its_replicas_placed_on_the_other_host(redis_server, redis_client, tmp_path):
    registry = RedisApiRegistry(redis_client)
    registry.put(ApiConfig.from_dict({"name": "iris", "kind": "RealtimeAPI", "predictor": {"path": "predictor.py"},
                                      "autoscaling": {"min_replicas": 2}}), "aa" * 32)
    directory = RedisHostDirectory(redis_client)
    placement = RealtimePlacement(registry, directory, RedisScaleBook(redis_client),
                                  RedisReplicaAssignments(redis_client))
    database = redis_server.rsplit("/", 1)[0] + "/1"  # redis_client's
    env = {**os.environ, "SLUICE_REDIS_URL": database, "SLUICE_STORAGE": str(tmp_path / "storage"),
           "SLUICE_CACHE_DIR": str(tmp_path / "cache")}
    agents = {
        host: subprocess.Popen([sys.executable, "-m", "sluice.cli", "replicas", "--host-id", host, "--cpu", "1",
                                "--mem", "4Gi", "--gpu", "0"], env=env, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for host in ("host-a", "host-b")
    }
    try:
        wait_for(lambda: {h.host_id for h in directory.live(time.time())} == set(agents), 60, "both hosts announced")
        assert directory.all()[0].offers == Resources(1000, 4 * 2**30, 0)
        assert placement.reconcile(time.time())["iris"].hosts == {"host-a": 1, "host-b": 1}

        agents["host-b"].send_signal(signal.SIGKILL)  # no goodbye: its heartbeat just stops
        agents["host-b"].wait()
        after_ttl = time.time() + HOST_TTL_S + 1  # placement's clock, once host-b's record has gone stale
        wait_for(lambda: directory.live(after_ttl) != [], 30, "a heartbeat of host-a after host-b's last one")
        placed = placement.reconcile(after_ttl)["iris"]
        assert placed.hosts == {"host-a": 2} and placed.pending == 0
    finally:
        for agent in agents.values():
            if agent.poll() is None:
                agent.send_signal(signal.SIGTERM)
                agent.wait(timeout=60)


def test_each_gpu_replica_gets_devices_no_other_holds_a_fifth_waits_and_a_freed_one_is_handed_out_again(
        redis_client, tmp_path):
    """A host told `--gpu 4` with five `gpu: 1` APIs assigned: four replicas on four GPUs, never two on
    one, and the fifth once one of them stops."""
    registry = RedisApiRegistry(redis_client)
    names = [f"g{i}" for i in range(5)]
    for name in names:
        registry.put(_config(name, gpu=1), "aa" * 32)
    registry.put(_config("on-cpu"), "aa" * 32)
    assigned = dict.fromkeys([*names, "on-cpu"], 1)
    launchers = Launchers()
    manager = ReplicaManager(registry, launchers.spawn, assigned=lambda: dict(assigned),
                             devices=HostDevices(tmp_path / "devices", host_gpus(4, {})))
    try:
        manager.step(100.0)
        given = {launcher.api: launchers.devices[launcher.process.pid] for launcher in manager.launchers.values()}
        gpus = {api: devices["CUDA_VISIBLE_DEVICES"] for api, devices in given.items() if devices}
        assert sorted(gpus.values()) == ["0", "1", "2", "3"] and len(gpus) == 4
        assert all(given[api]["NVIDIA_VISIBLE_DEVICES"] == gpu for api, gpu in gpus.items())
        assert given["on-cpu"] == {}  # a CPU replica is given no device
        [waiting] = set(names) - set(gpus)
        assert not manager.running(waiting)

        stopped = sorted(gpus)[0]
        assigned[stopped] = 0
        manager.step(101.0)
        [launcher] = [launcher for launcher in manager.launchers.values() if launcher.api == stopped]
        assert launcher.process.wait(timeout=30) == -signal.SIGTERM
        manager.step(102.0)
        manager.step(103.0)
        [late] = manager.running(waiting)
        assert launchers.devices[late.process.pid]["CUDA_VISIBLE_DEVICES"] == gpus[stopped]
    finally:
        manager.stop(grace=5)


def test_an_inferentia_replica_gets_neuron_cores_of_its_own(redis_client, tmp_path):
    registry = RedisApiRegistry(redis_client)
    registry.put(ApiConfig.from_dict({"name": "bert", "kind": "RealtimeAPI", "predictor": {"path": "predictor.py"},
                                      "compute": {"inf": 2}}), "aa" * 32)
    launchers = Launchers()
    folder = tmp_path / "devices"
    manager = ReplicaManager(registry, launchers.spawn, assigned=lambda: {"bert": 2},
                             devices=HostDevices(folder, host_gpus(0, {})),
                             cores=HostDevices(folder, host_cores(3, {}), kind=NEURON))
    try:
        manager.step(100.0)
        [launcher] = manager.running("bert")  # 3 cores: one replica of 2, the second waits
        assert launchers.devices[launcher.process.pid] == {"NEURON_RT_VISIBLE_CORES": "0,1"}
    finally:
        manager.stop(grace=5)
