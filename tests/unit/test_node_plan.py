"""Beat's plan for worker hosts: a job asking for more `workers` than run, or an AsyncAPI whose scaler
wants more nodes than serve its queue, gets nodes started on hosts with room, and a job that cannot
says why (`jobs/placement/node_plan.py`, `beat/worker_nodes.py`)."""

from __future__ import annotations

import pytest

from beat.worker_nodes import plan_worker_nodes
from foundation.hosts import HostRecord, Resources, shared_room
from foundation.memory import MemoryApiRegistry, MemoryHostDirectory
from jobs.asyncapi.memory import MemoryAsyncAssignments
from jobs.batch.job import Job
from jobs.nodes.memory import MemoryNodes, MemoryWorkerHosts
from jobs.placement.node_plan import (
    AsyncWant,
    JobWant,
    Shortfall,
    WorkerHostReport,
    describe,
    node_compute,
    plan_nodes,
)
from jobs.store.memory import MemoryJobStore
from predictors_runtime.config import ApiConfig
from tests.contracts.worker_hosts import WorkerHostsContract

T0 = 1_000_000.0
ONE_CPU = Resources.parse(cpu=1)


def host(host_id: str, cpu: float, nodes: tuple[str, ...], min_nodes: int = 1, gpu: int = 0,
         queues: tuple[str, ...] = ("cpu",)) -> tuple[HostRecord, WorkerHostReport]:
    record = HostRecord(host_id, host_id, Resources.parse(cpu=cpu, mem="64Gi", gpu=gpu), None, ("workers",), T0)
    return record, WorkerHostReport(host_id, queues, min_nodes, nodes, T0)


def job(job_id: str, workers: int, nodes: tuple[str, ...], compute: Resources = ONE_CPU, queue: str = "cpu") -> JobWant:
    return JobWant(job_id, queue, workers, compute, nodes)


def test_a_job_wanting_three_workers_on_a_host_running_one_node_gets_two_started_there() -> None:
    plan = plan_nodes([host("a", cpu=4, nodes=("a-1",))], [job("j1", 3, ("a-1",))], {"a-1": ["cpu"]}, {"a-1"}, T0)

    assert plan.hosts["a"].target == 3
    assert plan.hosts["a"].busy == ("a-1",)
    assert plan.notes == {"j1": "running on 1 of 3 workers: 2 nodes starting"}


def test_nodes_still_starting_count_so_the_next_plan_starts_none_twice() -> None:
    starting = host("a", cpu=4, nodes=("a-1", "a-2", "a-3"))

    plan = plan_nodes([starting], [job("j1", 3, ("a-1",))], {"a-1": ["cpu"]}, {"a-1"}, T0)

    assert plan.hosts["a"].target == 3


def test_a_host_without_room_starts_nothing_and_the_job_says_why() -> None:
    plan = plan_nodes([host("a", cpu=1, nodes=("a-1",))], [job("j1", 3, ("a-1",))], {"a-1": ["cpu"]}, {"a-1"}, T0)

    assert plan.hosts["a"].target == 1
    assert plan.notes["j1"] == "running on 1 of 3 workers: no host has room for 2 more nodes of 1 cpu"


def test_what_fits_is_started_and_only_the_rest_is_reported_missing() -> None:
    plan = plan_nodes([host("a", cpu=2, nodes=("a-1",))], [job("j1", 3, ("a-1",))], {"a-1": ["cpu"]}, {"a-1"}, T0)

    assert plan.hosts["a"].target == 2
    assert plan.notes["j1"] == "running on 1 of 3 workers: no host has room for 1 more node of 1 cpu"


def test_starts_spread_over_the_hosts_with_the_most_room() -> None:
    hosts = [host("a", cpu=4, nodes=("a-1",)), host("b", cpu=4, nodes=("b-1",))]
    live = {"a-1": ["cpu"], "b-1": ["cpu"]}

    plan = plan_nodes(hosts, [job("j1", 4, ("a-1", "b-1"))], live, {"a-1", "b-1"}, T0)

    assert (plan.hosts["a"].target, plan.hosts["b"].target) == (2, 2)


def test_a_gpu_job_fits_only_where_gpus_are_free() -> None:
    gpu_node = Resources.parse(cpu=1, gpu=1)
    hosts = [host("cpu-box", cpu=16, nodes=(), min_nodes=0), host("gpu-box", cpu=16, gpu=1, nodes=("g-1",),
                                                                   queues=("gpu",))]

    plan = plan_nodes(hosts, [job("j1", 2, ("g-1",), gpu_node, queue="gpu")], {"g-1": ["gpu"]}, {"g-1"}, T0)

    assert plan.hosts["gpu-box"].target == 1
    assert plan.hosts["cpu-box"].target == 0
    assert plan.notes["j1"] == "running on 1 of 2 workers: no host has room for 1 more node of 1 cpu, 1 gpu"


def test_a_node_placed_on_a_big_job_takes_that_jobs_room() -> None:
    hosts = [host("a", cpu=4, nodes=("a-1",))]
    big, small = job("big", 1, ("a-1",), Resources.parse(cpu=3)), job("small", 2, ("a-1",))

    plan = plan_nodes(hosts, [big, small], {"a-1": ["cpu"]}, {"a-1"}, T0)

    assert plan.hosts["a"].target == 2  # 3 cpu taken, room for one node of 1 cpu


def test_without_any_worker_host_the_job_says_no_node_can_be_started() -> None:
    plan = plan_nodes([], [job("j1", 2, ("celery@by-hand",))], {"celery@by-hand": ["cpu"]}, set(), T0)

    assert plan.notes["j1"].startswith("running on 1 of 2 workers: no worker host (`sluice workers`) serves queue cpu")


def test_once_the_jobs_end_a_host_is_asked_only_for_its_minimum_and_none_is_busy() -> None:
    plan = plan_nodes([host("a", cpu=4, nodes=("a-1", "a-2", "a-3"))], [],
                      {"a-1": ["cpu"], "a-2": ["cpu"], "a-3": ["cpu"]}, set(), T0)

    assert plan.hosts["a"].target == 1
    assert plan.hosts["a"].busy == ()
    assert plan.notes == {}


def test_a_job_on_all_its_workers_has_no_note() -> None:
    plan = plan_nodes([host("a", cpu=4, nodes=("a-1",))], [job("j1", 1, ("a-1",))], {"a-1": ["cpu"]}, {"a-1"}, T0)

    assert plan.notes == {}


def test_compute_is_read_as_cortex_writes_it_and_told_as_people_read_it() -> None:
    assert node_compute(None) == ONE_CPU
    assert describe(node_compute({"cpu": "500m", "mem": "2Gi", "gpu": 1})) == "500m cpu, 2Gi mem, 1 gpu"
    assert describe(node_compute({"cpu": 2, "mem": "300Mi"})) == "2 cpu, 300Mi mem"


def test_beats_step_reads_the_job_store_and_writes_each_hosts_plan_and_each_jobs_note() -> None:
    store, hosts, worker_hosts = MemoryJobStore(), MemoryHostDirectory(), MemoryWorkerHosts()
    nodes = MemoryNodes(4.0, inflight=store.inflight)
    record, report = host("a", cpu=1, nodes=("a-1",))
    hosts.announce(record)
    worker_hosts.report(report)
    nodes.heartbeat("a-1", ["cpu"], T0)
    submitted = Job("j1", "iris", 3, {}, None, 10, T0, api_spec={"compute": {"cpu": 1}})
    store.create(submitted)
    store.set_nodes("j1", ["a-1"])

    plan_worker_nodes(store, nodes, hosts, worker_hosts, MemoryApiRegistry(), MemoryAsyncAssignments(), T0)

    assert worker_hosts.note_of("j1") == "running on 1 of 3 workers: no host has room for 2 more nodes of 1 cpu"
    plan = worker_hosts.plan_of("a")
    assert plan is not None and plan.target == 1 and plan.busy == ("a-1",)


# -- AsyncAPIs: their scaler's count is demand, as a job's `workers` ------------------------------------


def async_api(name: str, desired: int, nodes: tuple[str, ...], compute: Resources = ONE_CPU,
              queue: str = "cpu") -> AsyncWant:
    return AsyncWant(name, queue, desired, compute, nodes)


def test_an_async_api_woken_from_zero_gets_a_node_started_on_a_host_that_keeps_none() -> None:
    plan = plan_nodes([host("a", cpu=4, nodes=(), min_nodes=0)], [], {}, set(), T0, [async_api("asy", 1, ())])

    assert plan.hosts["a"].target == 1
    assert plan.notes == {}  # notes are jobs' (an API's shortfall shows as desired against placed)


def test_an_async_api_scaled_past_its_queues_live_nodes_gets_the_rest_started() -> None:
    plan = plan_nodes([host("a", cpu=4, nodes=("a-1",))], [], {"a-1": ["cpu"]}, {"a-1"}, T0,
                      [async_api("asy", 3, ("a-1",))])

    assert plan.hosts["a"].target == 3
    assert plan.hosts["a"].busy == ("a-1",)


def test_an_async_api_and_a_job_on_one_queue_share_nodes_so_the_larger_count_is_started() -> None:
    plan = plan_nodes([host("a", cpu=8, nodes=("a-1",))], [job("j1", 2, ("a-1",))], {"a-1": ["cpu"]}, {"a-1"}, T0,
                      [async_api("asy", 3, ("a-1",))])

    assert plan.hosts["a"].target == 3


def test_an_async_api_of_the_gpu_queue_starts_nodes_only_on_gpu_hosts_with_a_gpu_free() -> None:
    hosts = [host("cpu-box", cpu=16, nodes=(), min_nodes=0),
             host("gpu-box", cpu=16, gpu=1, nodes=(), min_nodes=0, queues=("gpu",))]

    plan = plan_nodes(hosts, [], {}, set(), T0, [async_api("asy", 2, (), Resources.parse(cpu=1, gpu=1), "gpu")])

    assert (plan.hosts["cpu-box"].target, plan.hosts["gpu-box"].target) == (0, 1)


def test_a_node_placed_on_a_big_async_api_takes_that_apis_room_from_a_jobs_new_nodes() -> None:
    plan = plan_nodes([host("a", cpu=4, nodes=("a-1",))], [job("j1", 3, ())], {"a-1": ["cpu"]}, {"a-1"}, T0,
                      [async_api("big", 1, ("a-1",), Resources.parse(cpu=3))])

    assert plan.hosts["a"].target == 2  # 3 cpu held by the API's node: room for one more node of 1 cpu
    assert plan.notes["j1"] == "running on 0 of 3 workers: no host has room for 1 more node of 1 cpu"


def test_an_async_api_served_by_enough_nodes_starts_none() -> None:
    live = {"a-1": ["cpu"], "a-2": ["cpu"]}

    plan = plan_nodes([host("a", cpu=4, nodes=("a-1", "a-2"))], [], live, {"a-1"}, T0, [async_api("asy", 1, ("a-1",))])

    assert plan.hosts["a"].target == 1  # a-2 is idle extra: the agent stops it after its grace
    assert plan.hosts["a"].busy == ("a-1",)


def test_an_async_api_scaled_back_to_zero_leaves_its_node_idle_above_the_minimum() -> None:
    plan = plan_nodes([host("a", cpu=4, nodes=("a-1",), min_nodes=0)], [], {"a-1": ["cpu"]}, set(), T0,
                      [async_api("asy", 0, ())])

    assert plan.hosts["a"].target == 0
    assert plan.hosts["a"].busy == ()


def deploy_async(registry: MemoryApiRegistry, name: str, **compute: object) -> None:
    spec = {"name": name, "kind": "AsyncAPI", "predictor": {"path": "p.py"}, "compute": compute,
            "autoscaling": {"min_replicas": 0}}
    registry.put(ApiConfig.model_validate(spec), "bundle-1", now=T0)


def test_beats_step_reads_the_async_apis_placed_count_and_compute_and_plans_their_nodes() -> None:
    store, hosts, worker_hosts = MemoryJobStore(), MemoryHostDirectory(), MemoryWorkerHosts()
    registry, assignments = MemoryApiRegistry(), MemoryAsyncAssignments()
    nodes = MemoryNodes(4.0, inflight=store.inflight)
    record, report = host("a", cpu=4, nodes=(), min_nodes=0)
    hosts.announce(record)
    worker_hosts.report(report)
    deploy_async(registry, "woken", cpu=2)
    deploy_async(registry, "unplaced")  # deployed since placement's step: not planned yet
    assignments.set("woken", [], desired=2, in_flight=1.0)  # its scaler woke it: no live node serves queue cpu
    assignments.set("deleted", ["gone-1"], desired=0)  # a deleted API draining on a node: busy

    plan = plan_worker_nodes(store, nodes, hosts, worker_hosts, registry, assignments, T0)

    stored = worker_hosts.plan_of("a")
    assert stored is not None and stored.target == 2  # room for two nodes of 2 cpu
    assert plan.hosts["a"].target == 2


def test_an_async_apis_nodes_are_busy_so_its_host_keeps_them() -> None:
    store, hosts, worker_hosts = MemoryJobStore(), MemoryHostDirectory(), MemoryWorkerHosts()
    registry, assignments = MemoryApiRegistry(), MemoryAsyncAssignments()
    nodes = MemoryNodes(4.0, inflight=store.inflight)
    record, report = host("a", cpu=4, nodes=("a-1", "a-2"), min_nodes=0)
    hosts.announce(record)
    worker_hosts.report(report)
    nodes.heartbeat("a-1", ["cpu"], T0)
    nodes.heartbeat("a-2", ["cpu"], T0)
    deploy_async(registry, "asy")
    assignments.set("asy", ["a-2"], desired=1)

    plan_worker_nodes(store, nodes, hosts, worker_hosts, registry, assignments, T0)

    stored = worker_hosts.plan_of("a")
    assert stored is not None and stored.target == 1 and stored.busy == ("a-2",)


class TestMemoryWorkerHostsKeepsTheContract(WorkerHostsContract):
    @pytest.fixture
    def worker_hosts(self) -> MemoryWorkerHosts:
        return MemoryWorkerHosts()


def test_nodes_that_fit_nowhere_are_the_queues_shortfall_with_their_size() -> None:
    gpu_node = Resources.parse(cpu=1, gpu=1)
    plan = plan_nodes([host("a", cpu=8, gpu=1, nodes=("a-1",), queues=("gpu",))],
                      [job("j1", 4, ("a-1",), compute=gpu_node, queue="gpu")], {"a-1": ["gpu"]}, {"a-1"}, T0)

    assert plan.shortfall == {"gpu": Shortfall(3, gpu_node)}


def test_a_queue_no_host_serves_is_short_of_every_node_its_jobs_want() -> None:
    plan = plan_nodes([], [job("j1", 2, (), queue="gpu")], {}, set(), T0)

    assert plan.shortfall == {"gpu": Shortfall(2, ONE_CPU)}


def test_a_queue_whose_nodes_all_fit_has_no_shortfall() -> None:
    plan = plan_nodes([host("a", cpu=4, nodes=("a-1",))], [job("j1", 3, ("a-1",))], {"a-1": ["cpu"]}, {"a-1"}, T0)

    assert plan.shortfall == {}


@pytest.mark.parametrize(("nodes", "busy", "jobs", "holds"), [
    (("a-1",), set(), [], False),                        # its idle minimum: nothing held
    (("a-1",), {"a-1"}, [job("j1", 1, ("a-1",))], True),  # a node placed on a job
    (("a-1",), set(), [job("j1", 2, ())], True),          # nodes starting for a job
    ((), set(), [], False),                               # min 0 and nothing to do
])
def test_a_host_holds_something_when_a_node_is_busy_or_starting_for_a_demand(
        nodes: tuple[str, ...], busy: set[str], jobs: list[JobWant], holds: bool) -> None:
    plan = plan_nodes([host("a", cpu=4, nodes=nodes, min_nodes=len(nodes))], jobs, {n: ["cpu"] for n in nodes},
                      busy, T0)

    assert plan.hosts["a"].holds is holds


def test_a_node_started_for_a_job_beyond_the_minimum_holds_its_host_until_it_is_up() -> None:
    starting = host("a", cpu=4, nodes=("a-1", "a-2"), min_nodes=1)

    plan = plan_nodes([starting], [job("j1", 2, ("a-1",))], {"a-1": ["cpu"]}, {"a-1"}, T0)
    idle_min = plan_nodes([host("a", cpu=4, nodes=("a-1",), min_nodes=1)], [], {}, set(), T0)

    assert plan.hosts["a"].holds is True
    assert idle_min.hosts["a"].holds is False  # its one node starting is its minimum, for no demand


# -- one machine's room, counted once ---------------------------------------------------------------------
def test_what_replicas_take_of_a_machine_is_not_offered_again_to_its_worker_nodes() -> None:
    """`sluice up` on 4 cpus: with 3 cpus held by its realtime replicas, a job of `workers: 3` (1 cpu
    each) gets one node more, not two: the machine is one room."""
    replicas_take = {"box-workers": Resources.parse(cpu=3)}
    plan = plan_nodes([host("box-workers", cpu=4, nodes=("n-1",), min_nodes=0)], [job("j1", 3, ("n-1",))],
                      {"n-1": ["cpu"]}, {"n-1"}, T0, taken=replicas_take)
    assert plan.hosts["box-workers"].target == 1  # n-1 runs the job; nothing more fits beside the replicas
    assert plan.notes["j1"] == "running on 1 of 3 workers: no host has room for 2 more nodes of 1 cpu"
    alone = plan_nodes([host("box-workers", cpu=4, nodes=("n-1",), min_nodes=0)], [job("j1", 3, ("n-1",))],
                       {"n-1": ["cpu"]}, {"n-1"}, T0)
    assert alone.hosts["box-workers"].target == 3
    assert alone.hosts["box-workers"].takes == Resources.parse(cpu=3)  # n-1 and the two started for the job


def test_a_machines_room_is_shared_by_its_records_of_one_room_only() -> None:
    workers = HostRecord("box-workers", "box", Resources.parse(cpu=4), None, ("workers",), T0, room="box")
    replicas = HostRecord("box:8888", "box", Resources.parse(cpu=4), None, ("replicas",), T0, room="box")
    other = HostRecord("far:8888", "far", Resources.parse(cpu=4), None, ("replicas",), T0)
    on = {"box:8888": Resources.parse(cpu=3), "far:8888": Resources.parse(cpu=4)}
    assert shared_room([workers, replicas, other], "workers", on) == {"box-workers": Resources.parse(cpu=3)}
    assert shared_room([workers, replicas, other], "replicas", {"box-workers": Resources.parse(cpu=1)}) == {
        "box:8888": Resources.parse(cpu=1)}


def test_inferentia_cores_are_counted_like_gpus() -> None:
    """A job of `compute.inf: 2` on an Inferentia host offering 4 cores gets two nodes, not three."""
    record = HostRecord("inf-host", "inf-host", Resources.parse(cpu=16, mem="64Gi", inf=4), None, ("workers",), T0)
    report = WorkerHostReport("inf-host", ("inf",), 0, (), T0)
    two_cores = Resources.parse(cpu=1, inf=2)
    plan = plan_nodes([(record, report)], [job("j1", 3, (), compute=two_cores, queue="inf")], {}, set(), T0)
    assert plan.hosts["inf-host"].target == 2
    assert plan.notes["j1"] == "running on 0 of 3 workers: no host has room for 1 more node of 1 cpu, 2 inf"
    assert node_compute({"cpu": 1, "inf": 2}) == two_cores
