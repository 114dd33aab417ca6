"""How many hosts each host pool wants, the figure KEDA scales host pods on: the busy hosts of the
pool plus new ones, of the pool's size, for what placement could not place; pools declared in
`SLUICE_HOST_POOLS` (`jobs/placement/host_demand.py`, `foundation/host_pools.py`,
`beat/host_demand.py`)."""

from __future__ import annotations

import json

import pytest

from beat.host_demand import HostDemandWatch
from foundation.errors import ConfigError
from foundation.host_pools import HostPool, parse_host_pools
from foundation.hosts import HostRecord, Resources
from foundation.memory import MemoryApiRegistry, MemoryHostDirectory, MemoryReplicaAssignments, MemoryScaleBook
from foundation.replica_placement import PlacedReplicas
from foundation.settings import Settings
from jobs.nodes.memory import MemoryWorkerHosts
from jobs.placement.host_demand import HostDemand, PoolFigures, Unplaced, host_demand
from jobs.placement.node_plan import HostPlan, NodePlan, Shortfall
from jobs.placement.realtime import RealtimePlacement
from predictors_runtime.config import ApiConfig

T0 = 1_000_000.0
CPU_POOL = HostPool("workers-cpu", "workers", "cpu", Resources.parse(cpu=4, mem="16Gi"))
GPU_POOL = HostPool("workers-gpu", "workers", "gpu", Resources.parse(cpu=8, mem="32Gi", gpu=2))
REPLICA_POOL = HostPool("replicas-cpu", "replicas", "cpu", Resources.parse(cpu=2, mem="4Gi"))


def member(host_id: str, pool: HostPool, role: str = "workers") -> HostRecord:
    return HostRecord(host_id, host_id, pool.offers, pool.hardware, (role,), T0, pool.name)


def test_a_pool_with_nothing_to_do_wants_no_host_so_it_can_scale_to_zero() -> None:
    demand = host_demand([CPU_POOL], [member("a", CPU_POOL), member("b", CPU_POOL)], set(), [], T0)

    assert demand.pools == {"workers-cpu": PoolFigures(busy=0, idle=2, wanted=0)}


def test_a_gpu_job_on_a_pool_at_zero_wants_the_hosts_that_hold_its_nodes() -> None:
    unplaced = [Unplaced("workers", "gpu", 3, Resources.parse(cpu=1, gpu=1))]

    demand = host_demand([CPU_POOL, GPU_POOL], [], set(), unplaced, T0)

    assert demand.pools["workers-gpu"] == PoolFigures(busy=0, idle=0, wanted=2)  # 2 gpus a host: 3 nodes need 2
    assert demand.pools["workers-cpu"].wanted == 0
    assert demand.unplaced == {("workers", "gpu"): 3}


def test_busy_hosts_stay_wanted_and_idle_ones_do_not() -> None:
    hosts = [member("a", CPU_POOL), member("b", CPU_POOL), member("c", CPU_POOL)]
    unplaced = [Unplaced("workers", "cpu", 5, Resources.parse(cpu=1))]

    demand = host_demand([CPU_POOL], hosts, {"a", "c"}, unplaced, T0)

    assert demand.pools["workers-cpu"] == PoolFigures(busy=2, idle=1, wanted=2 + 2)  # 5 one-cpu nodes: 2 more hosts


def test_units_of_several_sizes_are_packed_largest_first() -> None:
    unplaced = [Unplaced("workers", "cpu", 2, Resources.parse(cpu=3)),
                Unplaced("workers", "cpu", 2, Resources.parse(cpu=1))]

    demand = host_demand([CPU_POOL], [], set(), unplaced, T0)

    assert demand.pools["workers-cpu"].wanted == 2  # 3+1 on each of two 4-cpu hosts


def test_pending_replicas_want_replica_hosts_and_no_worker_host() -> None:
    unplaced = [Unplaced("replicas", "cpu", 3, Resources.parse(cpu="500m", mem="1Gi"))]

    demand = host_demand([CPU_POOL, REPLICA_POOL], [member("r1", REPLICA_POOL, "replicas")], {"r1"}, unplaced, T0)

    assert demand.pools["replicas-cpu"] == PoolFigures(busy=1, idle=0, wanted=2)
    assert demand.pools["workers-cpu"].wanted == 0


def test_a_unit_too_big_for_every_pool_is_counted_unplaced_but_wants_no_host() -> None:
    unplaced = [Unplaced("workers", "cpu", 1, Resources.parse(cpu=16))]

    demand = host_demand([CPU_POOL], [], set(), unplaced, T0)

    assert demand.pools["workers-cpu"].wanted == 0
    assert demand.unplaced == {("workers", "cpu"): 1}


def test_without_pools_only_what_is_unplaced_is_counted() -> None:
    demand = host_demand([], [], set(), [Unplaced("replicas", "gpu", 2, Resources.parse(cpu=1, gpu=1))], T0)

    assert demand == HostDemand({}, {("replicas", "gpu"): 2}, T0)


def test_a_host_of_no_pool_counts_in_none() -> None:
    loose = HostRecord("laptop", "laptop", CPU_POOL.offers, "cpu", ("workers",), T0)

    demand = host_demand([CPU_POOL], [loose], {"laptop"}, [], T0)

    assert demand.pools["workers-cpu"] == PoolFigures(0, 0, 0)


def test_the_figures_read_back_as_written() -> None:
    demand = HostDemand({"workers-cpu": PoolFigures(1, 2, 3)}, {("workers", "gpu"): 4}, T0)

    assert HostDemand.from_dict(json.loads(json.dumps(demand.to_dict()))) == demand


def test_beats_step_joins_the_worker_plan_and_the_replica_placement() -> None:
    hosts = MemoryHostDirectory()
    for record in (member("w1", CPU_POOL), member("w2", CPU_POOL), member("r1", REPLICA_POOL, "replicas")):
        hosts.announce(record)
    worker_hosts = MemoryWorkerHosts()
    worker_hosts.write_plan(NodePlan({"w1": HostPlan(1, ("w1-1",), T0, holds=True), "w2": HostPlan(1, (), T0)}, {},
                                     {"cpu": Shortfall(4, Resources.parse(cpu=1))}))
    assignments = MemoryReplicaAssignments()
    assignments.set("iris", PlacedReplicas({"r1": 1}, 3, 2, "no host has 200m cpu free"))
    registry = MemoryApiRegistry()
    registry.put(ApiConfig.from_dict({"name": "iris", "kind": "RealtimeAPI",
                                      "predictor": {"type": "python", "path": "p.py"}}), "sha256-abc")
    realtime = RealtimePlacement(registry, hosts, MemoryScaleBook(), assignments)
    book = RecordingBook()

    demand = HostDemandWatch([CPU_POOL, REPLICA_POOL]).step(hosts, worker_hosts, realtime, book, T0)  # type: ignore[arg-type]

    assert demand.pools == {"workers-cpu": PoolFigures(busy=1, idle=1, wanted=2),
                            "replicas-cpu": PoolFigures(busy=1, idle=0, wanted=2)}
    assert demand.unplaced == {("workers", "cpu"): 4, ("replicas", "cpu"): 2}
    assert book.written == [demand]


class RecordingBook:
    def __init__(self) -> None:
        self.written: list[HostDemand] = []

    def write(self, demand: HostDemand) -> None:
        self.written.append(demand)


def test_pools_are_read_from_the_setting() -> None:
    raw = json.dumps([
        {"name": "workers-gpu", "role": "workers", "hardware": "gpu", "cpu": "8", "mem": "32Gi", "gpu": 2},
        {"name": "replicas-cpu", "role": "replicas", "cpu": "1500m"},
    ])

    pools = Settings.from_env({"SLUICE_HOST_POOLS": raw}).host_pools

    assert pools == (GPU_POOL, HostPool("replicas-cpu", "replicas", "cpu", Resources.parse(cpu="1500m")))
    assert parse_host_pools(None) == () and parse_host_pools("  ") == ()


@pytest.mark.parametrize(("raw", "names"), [
    ("{", "not JSON"),
    ('{"name": "a"}', "expected a JSON list"),
    ('[{"name": "A b", "role": "workers", "cpu": 1}]', "SLUICE_HOST_POOLS[0].name"),
    ('[{"name": "a", "role": "nodes", "cpu": 1}]', "SLUICE_HOST_POOLS[0].role"),
    ('[{"name": "a", "role": "workers", "hardware": "tpu", "cpu": 1}]', "SLUICE_HOST_POOLS[0].hardware"),
    ('[{"name": "a", "role": "workers", "cpu": "lots"}]', "cpu must be a number"),
    ('[{"name": "a", "role": "workers"}]', "SLUICE_HOST_POOLS[0].cpu"),
    ('[{"name": "a", "role": "workers", "cpu": 1, "size": 3}]', "unknown field(s) size"),
    ('[{"name": "a", "role": "workers", "cpu": 1}, {"name": "a", "role": "replicas", "cpu": 1}]', "a repeated"),
])
def test_a_pool_that_cannot_be_used_is_refused_naming_its_field(raw: str, names: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_host_pools(raw)

    assert names in str(refused.value)
