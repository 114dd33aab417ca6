"""A host pod's deletion cost follows what the host runs, so that a host pool scaled in loses an
idle host first (`sluice/pod_deletion_cost.py`, kept by `sluice workers` and `sluice replicas`)."""

from __future__ import annotations

from typing import Any

import pytest

from foundation.hosts import Resources
from foundation.memory import MemoryHostDirectory, MemoryReplicaAssignments
from foundation.replica_placement import PlacedReplicas
from jobs.nodes.memory import MemoryNodes, MemoryWorkerHosts
from jobs.placement.node_plan import HostPlan, NodePlan
from sluice.pod_deletion_cost import ANNOTATION, RETRY_S, PodDeletionCost, deletion_cost, in_pod
from sluice.replica_manager import HostAgent
from sluice.worker_host import AgentConfig, WorkerHost, held_units

T0 = 1_000_000.0


class PodApi:
    """The Kubernetes API as the keeper sees it: the patches it was sent; failing when told."""

    def __init__(self) -> None:
        self.patches: list[dict[str, Any]] = []
        self.failing = False

    def __call__(self, body: dict[str, Any]) -> None:
        if self.failing:
            raise ConnectionError("the API server is away")
        self.patches.append(body)

    @property
    def costs(self) -> list[str]:
        return [p["metadata"]["annotations"][ANNOTATION] for p in self.patches]


def test_an_idle_host_costs_nothing_and_a_busier_one_more() -> None:
    assert deletion_cost(0) == 0
    assert deletion_cost(1) < deletion_cost(3)
    assert deletion_cost(10**12) == 2**31 - 1  # the annotation is an int32


def test_the_pod_is_patched_when_the_cost_changes_and_only_then() -> None:
    api = PodApi()
    keeper = PodDeletionCost(api)

    for held in (0, 0, 2, 2, 1, 0):
        keeper.update(held, T0)

    assert api.costs == ["0", "2", "1", "0"]
    assert api.patches[0] == {"metadata": {"annotations": {ANNOTATION: "0"}}}


def test_a_failed_patch_is_tried_again_after_a_while_not_every_step() -> None:
    api = PodApi()
    keeper = PodDeletionCost(api)
    api.failing = True

    keeper.update(3, T0)
    api.failing = False
    keeper.update(3, T0 + 1)
    assert api.costs == [] and keeper.written is None

    keeper.update(3, T0 + RETRY_S)
    assert api.costs == ["3"] and keeper.written == 3


def test_a_worker_host_costs_what_beats_plan_says_it_holds() -> None:
    api = PodApi()
    worker_hosts = MemoryWorkerHosts()
    config = AgentConfig("box-workers", ("cpu",), Resources.parse(cpu=4), min_nodes=1, idle_grace_s=5.0)
    agent = WorkerHost(config, lambda name, extra: Node(), MemoryHostDirectory(), worker_hosts, MemoryNodes(4.0),
                       node_host="box", cost=PodDeletionCost(api))

    plans = [HostPlan(1, (), T0), HostPlan(2, (), T0, holds=True), HostPlan(2, ("box-workers-1@box",
             "box-workers-2@box"), T0 + 1, holds=True), HostPlan(1, (), T0 + 2)]
    for i, plan in enumerate(plans):
        worker_hosts.write_plan(NodePlan({"box-workers": plan}))
        agent.step(T0 + i)

    assert api.costs == ["0", "1", "2", "0"]  # idle; starting a node for a job; two busy nodes; idle again
    assert [held_units(p) for p in plans] == [0, 1, 2, 0]


def test_a_replica_host_costs_the_replicas_placed_on_it() -> None:
    assignments = MemoryReplicaAssignments()
    agent = HostAgent(MemoryHostDirectory(), assignments, host_id="h", address="10.0.0.1", offers=Resources(2000),
                      hardware=None, pool="replicas-cpu")
    assert agent.held() == 0

    assignments.set("iris", PlacedReplicas({"h": 2, "other": 1}, 3))
    assignments.set("mpg", PlacedReplicas({"h": 1}, 1))

    assert agent.held() == 3


class Node:
    def poll(self) -> int | None:
        return None

    def send_signal(self, sig: int) -> None:
        pass

    def wait(self, timeout: float | None = None) -> int:
        return 0

    def kill(self) -> None:
        pass


@pytest.mark.parametrize("env", [{}, {"SLUICE_POD_NAME": "sluice-workers-cpu-0"},
                                 {"SLUICE_POD_NAMESPACE": "sluice"}])
def test_outside_a_pod_no_cost_is_kept(env: dict[str, str]) -> None:
    assert in_pod(env) is None


def test_in_a_pod_a_keeper_is_made_without_calling_the_api_yet() -> None:
    keeper = in_pod({"SLUICE_POD_NAME": "sluice-workers-cpu-0", "SLUICE_POD_NAMESPACE": "sluice"})

    assert keeper is not None and keeper.written is None
