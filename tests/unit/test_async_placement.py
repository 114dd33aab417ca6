"""Which worker nodes serve each AsyncAPI: `autoscaling.min_replicas` of its hardware queue, placed
as jobs are (least loaded first, kept while alive), told to consume the API's own queue."""

from __future__ import annotations

from collections import Counter
from typing import Any

from foundation.memory import MemoryApiRegistry
from jobs.asyncapi.memory import MemoryAsyncAssignments, MemoryAsyncRequests
from jobs.asyncapi.request import AsyncRequest, PayloadKind, RequestStatus
from jobs.nodes.memory import MemoryNodes
from jobs.placement.asyncapi import AsyncPlacement, async_queue
from jobs.transport.memory import MemoryJobQueues
from predictors_runtime.config import ApiConfig

NOW = 1_000.0


class World:
    def __init__(self, job_load: dict[str, int] | None = None) -> None:
        self.registry = MemoryApiRegistry()
        self.requests = MemoryAsyncRequests()
        self.assignments = MemoryAsyncAssignments()
        self.queues = MemoryJobQueues()
        self.nodes = MemoryNodes(node_ttl_s=10, inflight=self.requests.inflight)
        self.placement = AsyncPlacement(self.registry, self.requests, self.assignments, self.queues, self.nodes,
                                        lambda: Counter(job_load or {}))

    def node(self, name: str, *queues: str, now: float = NOW) -> None:
        self.nodes.heartbeat(name, list(queues) or ["cpu"], now)

    def deploy(self, name: str, compute: dict[str, Any] | None = None, **autoscaling: Any) -> None:
        spec: dict[str, Any] = {"name": name, "kind": "AsyncAPI", "predictor": {"path": "p.py"},
                                "autoscaling": autoscaling}
        if compute:
            spec["compute"] = compute
        self.registry.put(ApiConfig.model_validate(spec), "bundle-1", now=NOW)

    def submit(self, api: str, request_id: str) -> None:
        self.requests.create(AsyncRequest(api, request_id, RequestStatus.IN_QUEUE, PayloadKind.JSON, NOW,
                                          payload=b"1"), NOW)

    def added(self, api: str) -> list[str]:
        """The nodes last told to consume the API's queue."""
        adds = [nodes for kind, queue, nodes in self.queues.calls if kind == "add" and queue == async_queue(api)]
        return adds[-1] if adds else []


def test_an_async_api_is_served_by_one_node_by_default_and_apis_spread_over_the_least_loaded() -> None:
    w = World(job_load={"a": 1})  # node a already serves a job
    w.node("a"), w.node("b"), w.node("c")
    w.deploy("one"), w.deploy("two")
    w.placement.reconcile(NOW)
    one, two = w.assignments.all()["one"], w.assignments.all()["two"]
    assert len(one) == 1 and len(two) == 1 and one != two and "a" not in one + two
    assert w.added("one") == one and w.added("two") == two
    assert w.placement.assigned_queues(one[0]) == ["async.one"]


def test_a_new_api_gets_init_replicas_nodes_and_then_as_many_as_its_scaler_wants() -> None:
    w = World()
    w.node("a"), w.node("b"), w.node("c")
    w.deploy("api", min_replicas=1, init_replicas=2)
    first = w.placement.place(w.registry.get("api"), NOW)
    assert len(first) == 2 and w.added("api") == first
    w.placement.reconcile(NOW + 1)  # no scaler: the count stays
    assert w.assignments.all()["api"] == first
    w.placement.reconcile(NOW + 2, wanted=lambda api, in_flight, placed, now: 1)
    assert w.assignments.all()["api"] == first[:1]  # the node it keeps is one it had
    assert ("cancel", "async.api", first[1:]) in w.queues.calls
    w.placement.reconcile(NOW + 3, wanted=lambda api, in_flight, placed, now: 5)  # more than there are
    assert sorted(w.assignments.all()["api"]) == ["a", "b", "c"]
    assert w.assignments.placed()["api"].desired == 5  # shown as wanted: two pending


def test_the_scaler_is_told_the_apis_work_in_flight_and_its_live_nodes() -> None:
    w = World()
    w.node("a")
    w.deploy("api")
    w.placement.reconcile(NOW)
    w.submit("api", "r1"), w.submit("api", "r2")
    asked: list[tuple[str, int, int]] = []
    w.placement.reconcile(NOW + 1, wanted=lambda api, in_flight, placed, now: asked.append(
        (api.name, in_flight, placed)) or 1)
    assert asked == [("api", 2, 1)]
    assert w.assignments.placed()["api"].in_flight == 2


def test_with_min_replicas_0_no_node_serves_a_new_api_until_a_request_comes() -> None:
    w = World()
    w.node("a")
    w.deploy("api", min_replicas=0)
    assert w.placement.place(w.registry.get("api"), NOW) == [] and w.added("api") == []
    w.submit("api", "r1")
    w.placement.reconcile(NOW + 1)
    assert w.assignments.all()["api"] == ["a"] and w.added("api") == ["a"]


def test_an_api_whose_hardware_no_live_node_serves_waits_unplaced_until_one_comes() -> None:
    w = World()
    w.node("a")
    w.deploy("api", compute={"gpu": 1})
    assert w.placement.place(w.registry.get("api"), NOW) == []
    w.node("gpu-1", "gpu")
    w.placement.reconcile(NOW + 1)
    assert w.assignments.all()["api"] == ["gpu-1"]


def test_a_dead_nodes_place_goes_to_a_live_one_of_the_same_hardware() -> None:
    w = World()
    w.node("a"), w.node("gpu-1", "gpu"), w.node("b", now=NOW - 60)  # b stopped heartbeating long ago
    w.deploy("api")
    w.assignments.set("api", ["b"])
    w.placement.reconcile(NOW)
    assert w.assignments.all()["api"] == ["a"]  # never the gpu node: its hardware queue is not cpu


def test_a_deleted_api_keeps_its_node_until_its_requests_have_run_then_its_queue_goes() -> None:
    w = World()
    w.node("a")
    w.deploy("api")
    w.placement.reconcile(NOW)
    w.submit("api", "r1")
    w.registry.delete("api")
    w.placement.reconcile(NOW + 1)
    assert w.assignments.all()["api"] == ["a"] and w.queues.dropped == []  # r1 still to run (and fail)
    w.requests.finish("api", "r1", RequestStatus.FAILED, NOW + 2, message="api api is not deployed any more")
    w.placement.reconcile(NOW + 3)
    assert "api" not in w.assignments.all() and w.queues.dropped == ["async.api"]
    assert ("cancel", "async.api", ["a"]) in w.queues.calls


def test_a_nodes_heartbeat_names_its_hardware_queues_not_the_async_apis_placed_on_it() -> None:
    from jobs.nodes.registry import heartbeat_record

    assert heartbeat_record(["cpu", "async.summarise", "job.j1"], NOW)["queues"] == ["cpu"]
