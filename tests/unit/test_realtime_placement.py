"""Placing RealtimeAPIs' replicas on the room hosts offer (`jobs/placement/realtime.py`): spread
first, then pack, by hardware, stable, pending with a reason, and a dead host's replicas placed
again. The memory twins of the host directory, scale book and assignments, and a fixed clock.
"""

from __future__ import annotations

import pytest

from foundation.hosts import HOST_TTL_S, HostRecord, Resources
from foundation.memory import MemoryApiRegistry, MemoryHostDirectory, MemoryReplicaAssignments, MemoryScaleBook
from foundation.replica_placement import on_host
from foundation.replica_scale import ReplicaScale
from jobs.placement.realtime import RealtimePlacement
from predictors_runtime.config import ApiConfig

T0 = 1_000.0
GIB = 2**30


class World:
    """A registry, hosts and a scale book, with placement over them."""

    def __init__(self) -> None:
        self.registry = MemoryApiRegistry()
        self.hosts = MemoryHostDirectory()
        self.book = MemoryScaleBook()
        self.assignments = MemoryReplicaAssignments()
        self.placement = RealtimePlacement(self.registry, self.hosts, self.book, self.assignments)

    def host(self, host_id: str, cpu: str = "2", mem: str = "8Gi", gpu: int = 0, hardware: str | None = None,
             seen: float = T0) -> None:
        self.hosts.announce(HostRecord(host_id, f"10.0.0.{len(self.hosts.all()) + 1}",
                                       Resources.parse(cpu, mem, gpu), hardware, ("replicas",), seen))

    def deploy(self, name: str, compute: dict | None = None, autoscaling: dict | None = None,
               kind: str = "RealtimeAPI") -> None:
        spec = {"name": name, "kind": kind, "predictor": {"path": "predictor.py"},
                "compute": compute or {"cpu": "500m"}}
        if autoscaling:
            spec["autoscaling"] = autoscaling
        self.registry.put(ApiConfig.from_dict(spec), "aa" * 32)

    def want(self, name: str, desired: int) -> None:
        self.book.set(name, ReplicaScale(desired, float(desired), T0))

    def place(self, now: float = T0) -> dict[str, dict[str, int]]:
        return {name: placed.hosts for name, placed in self.placement.reconcile(now).items()}


@pytest.fixture
def world() -> World:
    return World()


def test_a_new_api_gets_its_init_replicas_before_any_scaler_decides(world):
    world.host("a")
    world.host("b")
    world.deploy("iris")
    world.deploy("mnist", autoscaling={"min_replicas": 2})
    assert world.place() == {"iris": {"a": 1}, "mnist": {"a": 1, "b": 1}}
    assert on_host(world.assignments.all(), "a") == {"iris": 1, "mnist": 1}


def test_replicas_spread_across_hosts_first_then_pack_onto_the_fullest_that_holds_one(world):
    world.host("a", cpu="4")
    world.host("b", cpu="2")
    world.deploy("iris")
    world.want("iris", 2)
    assert world.place() == {"iris": {"a": 1, "b": 1}}
    world.want("iris", 3)  # each host has one: the third goes where the least room is left
    assert world.place() == {"iris": {"a": 1, "b": 2}}
    world.want("iris", 7)  # b fills up (4 x 500m), a takes the rest
    assert world.place() == {"iris": {"a": 3, "b": 4}}


def test_several_replicas_of_one_api_share_a_host_when_that_is_where_the_room_is(world):
    world.host("small", cpu="500m")
    world.host("big", cpu="4")
    world.deploy("iris", compute={"cpu": 1})
    world.want("iris", 3)
    assert world.place() == {"iris": {"big": 3}}


def test_scaling_up_and_down_never_moves_a_running_replica(world):
    world.host("a")
    world.deploy("iris")
    assert world.place() == {"iris": {"a": 1}}
    world.host("b", cpu="64")  # a roomier host joins: iris stays where it runs
    assert world.place() == {"iris": {"a": 1}}
    world.want("iris", 3)
    assert world.place() == {"iris": {"a": 2, "b": 1}}
    world.want("iris", 2)  # down: from the host that runs the most of it
    assert world.place() == {"iris": {"a": 1, "b": 1}}


def test_gpu_apis_go_to_gpu_hosts_and_cpu_apis_to_hosts_not_kept_for_gpus(world):
    world.host("cpu-only", cpu="8", gpu=1, hardware="cpu")
    world.host("gpu-host", cpu="8", gpu=1, hardware="gpu")
    world.deploy("vision", compute={"cpu": 1, "gpu": 1})
    world.deploy("iris")
    world.want("iris", 2)
    assert world.place() == {"iris": {"cpu-only": 2}, "vision": {"gpu-host": 1}}


def test_what_fits_nowhere_is_pending_with_the_reason(world):
    world.host("a", cpu="1")
    world.deploy("vision", compute={"cpu": "200m", "gpu": 1})
    world.deploy("iris", compute={"cpu": "600m", "mem": "1Gi"})
    world.want("iris", 3)
    placed = world.placement.reconcile(T0)
    assert (placed["vision"].pending, placed["vision"].reason) == (1, "no host has 1 gpu free")
    assert placed["iris"].hosts == {"a": 1}
    assert (placed["iris"].pending, placed["iris"].reason) == (2, "no host has 600m cpu free")
    assert world.assignments.all()["iris"].pending == 2


def test_with_no_host_for_its_hardware_the_reason_says_so(world):
    world.host("a", hardware="gpu", gpu=2)
    world.deploy("iris")
    placed = world.placement.reconcile(T0)["iris"]
    assert placed.pending == 1 and placed.reason == "no live host offers room to replicas for cpu APIs"


def test_a_dead_host_s_replicas_are_placed_on_the_live_ones(world):
    world.host("a")
    world.host("b")
    world.deploy("iris")
    world.want("iris", 2)
    assert world.place() == {"iris": {"a": 1, "b": 1}}
    later = T0 + HOST_TTL_S + 1
    world.host("a", seen=later)  # b's heartbeat stopped
    assert world.place(later) == {"iris": {"a": 2}}


def test_a_shortened_host_ttl_places_a_silent_host_s_replicas_elsewhere_sooner(world):
    world.host("a")
    world.host("b")
    world.deploy("iris")
    world.want("iris", 2)
    world.place()
    later = T0 + 5  # b silent 5 s: alive under the default TTL, gone under SLUICE_HOST_TTL=4
    world.host("a", seen=later)
    assert world.place(later) == {"iris": {"a": 1, "b": 1}}
    short = RealtimePlacement(world.registry, world.hosts, world.book, world.assignments, host_ttl_s=4)
    assert {name: placed.hosts for name, placed in short.reconcile(later).items()} == {"iris": {"a": 2}}


def test_a_deleted_api_is_forgotten_and_other_kinds_are_not_placed(world):
    world.host("a")
    world.deploy("iris")
    world.deploy("jobs", kind="BatchAPI")
    world.place()
    world.registry.delete("iris")
    assert world.place() == {}
    assert world.assignments.all() == {}


def test_what_a_machines_worker_nodes_take_is_not_offered_again_to_its_replicas():
    """`sluice up` on 2 cpus with its worker nodes holding 1.5 of them (beat's last plan): one replica
    of 500m fits beside them, a second is pending, as if the machine had 0.5 cpu for replicas."""
    from jobs.nodes.memory import MemoryWorkerHosts
    from jobs.placement.node_plan import HostPlan, NodePlan

    world = World()
    worker_hosts = MemoryWorkerHosts()
    world.placement = RealtimePlacement(world.registry, world.hosts, world.book, world.assignments,
                                        worker_hosts=worker_hosts)
    world.hosts.announce(HostRecord("box:8888", "127.0.0.1", Resources.parse("2", "8Gi"), None, ("replicas",), T0,
                                    room="box"))
    world.hosts.announce(HostRecord("box-workers", "box", Resources.parse("2", "8Gi"), None, ("workers",), T0,
                                    room="box"))
    worker_hosts.write_plan(NodePlan({"box-workers": HostPlan(2, (), T0, takes=Resources.parse("1500m"))}))
    world.deploy("iris", autoscaling={"min_replicas": 2})
    placed = world.placement.reconcile(T0)["iris"]
    assert placed.hosts == {"box:8888": 1} and placed.pending == 1
    assert placed.reason == "no host has 500m cpu free"

    worker_hosts.write_plan(NodePlan({"box-workers": HostPlan(1, (), T0, takes=Resources.parse("500m"))}))
    assert world.placement.reconcile(T0 + 1)["iris"].hosts == {"box:8888": 2}  # the nodes gave room back
