"""The worker host's agent (`sluice workers`), one step at a time with a fixed clock: it keeps its
minimum, starts what beat's plan wants, warm-stops idle nodes above both after the grace period,
and restarts a node that dies (`sluice/worker_host.py`)."""

from __future__ import annotations

import signal

import pytest

from foundation.devices import NEURON, HostDevices, host_cores, host_gpus
from foundation.hosts import Resources
from foundation.memory import MemoryHostDirectory
from jobs.nodes.memory import MemoryNodes, MemoryWorkerHosts
from jobs.placement.node_plan import HostPlan, NodePlan
from sluice.worker_host import AgentConfig, BadAgentOption, WorkerHost

T0 = 1_000_000.0
GRACE_S = 5.0


class FakeNode:
    """A node process that exits when told to, or when the test says it died."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.signals: list[int] = []
        self.code: int | None = None
        self.pid = 0

    def poll(self) -> int | None:
        return self.code

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)

    def wait(self, timeout: float | None = None) -> int:
        self.code = 0 if self.code is None else self.code
        return self.code

    def kill(self) -> None:
        self.code = -9


class Host:
    """An agent over the in-memory directories, with every process it spawned."""

    def __init__(self, min_nodes: int = 1, gpus: int = 0, devices: HostDevices | None = None, inf: int = 0,
                 cores: HostDevices | None = None) -> None:
        self.hosts, self.worker_hosts = MemoryHostDirectory(), MemoryWorkerHosts()
        self.inflight: dict[str, dict[str, str]] = {}
        self.nodes = MemoryNodes(4.0, inflight=self.inflight)
        self.spawned: list[FakeNode] = []
        self.given: dict[str, dict[str, str]] = {}  # node -> the variables it was started with
        queues = ("gpu",) if gpus else ("inf",) if inf else ("cpu",)
        config = AgentConfig("box-workers", queues, Resources.parse(cpu=4, gpu=gpus, inf=inf), min_nodes=min_nodes,
                             idle_grace_s=GRACE_S, inf_per_node=2)
        self.agent = WorkerHost(config, self._spawn, self.hosts, self.worker_hosts, self.nodes, node_host="box",
                                devices=devices, cores=cores)

    def _spawn(self, name: str, extra: dict[str, str]) -> FakeNode:
        node = FakeNode(name)
        self.spawned.append(node)
        self.given[name] = dict(extra)
        return node

    def plan(self, target: int, busy: tuple[str, ...] = (), at: float = T0) -> None:
        self.worker_hosts.write_plan(NodePlan({"box-workers": HostPlan(target, busy, at)}))

    def all_registered(self, now: float) -> None:
        for name in self.agent.running:
            self.nodes.heartbeat(name, ["cpu"], now)


def test_an_agent_starts_its_minimum_and_announces_its_room_and_its_nodes() -> None:
    host = Host(min_nodes=2)

    host.agent.step(T0)

    assert sorted(host.agent.running) == ["box-workers-1@box", "box-workers-2@box"]
    [record] = host.hosts.live(T0)
    assert record.roles == ("workers",) and record.offers == Resources.parse(cpu=4) and record.hardware == "cpu"
    report = host.worker_hosts.reports()["box-workers"]
    assert report.nodes == ("box-workers-1@box", "box-workers-2@box") and report.min_nodes == 2


def test_the_plan_brings_more_nodes_and_a_repeated_plan_starts_none_twice() -> None:
    host = Host()
    host.agent.step(T0)
    host.plan(3, busy=("box-workers-1@box",))

    host.agent.step(T0 + 1)
    host.agent.step(T0 + 2)

    assert len(host.spawned) == 3
    assert host.worker_hosts.reports()["box-workers"].nodes == tuple(f"box-workers-{k}@box" for k in (1, 2, 3))


def test_idle_nodes_above_the_plan_are_warm_stopped_only_after_the_grace_and_never_below_the_minimum() -> None:
    host = Host()
    host.plan(3)
    host.agent.step(T0)
    host.all_registered(T0)
    host.plan(1, at=T0 + 1)  # the job ended: nothing is busy

    host.agent.step(T0 + 1)
    host.agent.step(T0 + 1 + GRACE_S - 0.5)
    assert not any(node.signals for node in host.spawned)

    host.agent.step(T0 + 1 + GRACE_S)

    assert [node.signals for node in host.spawned] == [[], [signal.SIGTERM], [signal.SIGTERM]]
    assert list(host.agent.running) == ["box-workers-1@box"]
    assert host.worker_hosts.reports()["box-workers"].nodes == ("box-workers-1@box",)

    for node in host.spawned[1:]:
        node.code = 0  # their warm shutdown ends
    host.agent.step(T0 + 2 + GRACE_S)
    assert host.agent.stopping == {} and len(host.spawned) == 3


def test_a_busy_node_or_one_holding_a_batch_is_not_stopped() -> None:
    host = Host(min_nodes=0)
    host.plan(2)
    host.agent.step(T0)
    host.all_registered(T0)
    first, second = sorted(host.agent.running)
    host.plan(0, busy=(first,), at=T0 + 1)
    host.inflight[second] = {"task": "j1:0"}  # placed since beat looked, already running a batch

    host.agent.step(T0 + 1)
    host.agent.step(T0 + 1 + GRACE_S)

    assert sorted(host.agent.running) == [first, second]


def test_without_a_fresh_plan_the_agent_holds_what_it_runs() -> None:
    host = Host()
    host.plan(3)
    host.agent.step(T0)
    host.all_registered(T0)

    host.agent.step(T0 + 1000)

    assert len(host.agent.running) == 3


def test_a_node_that_dies_is_started_again_under_its_name() -> None:
    host = Host()
    host.agent.step(T0)
    host.spawned[0].code = -9

    host.agent.step(T0 + 1)

    assert list(host.agent.running) == ["box-workers-1@box"]
    assert len(host.spawned) == 2 and host.agent.running["box-workers-1@box"] is host.spawned[1]


def test_stopping_the_agent_warm_stops_every_node_and_withdraws_the_host() -> None:
    host = Host(min_nodes=2)
    host.agent.step(T0)

    host.agent.stop(grace=1)

    assert all(node.signals == [signal.SIGTERM] and node.code == 0 for node in host.spawned)
    assert host.hosts.all() == [] and host.worker_hosts.reports() == {}


def test_each_node_of_a_gpu_host_gets_a_gpu_no_other_holds_a_fifth_waits_and_a_freed_one_is_handed_out(
        tmp_path) -> None:
    """`sluice workers --queues gpu --gpu 4` asked for five nodes: four on four GPUs, never two on one;
    the fifth waits until one stops for good, and a replica of the same machine cannot take a GPU a
    node holds."""
    devices = HostDevices(tmp_path / "devices", host_gpus(4, {}))
    host = Host(min_nodes=0, gpus=4, devices=devices)
    host.plan(5, at=T0)
    host.agent.step(T0)
    assert sorted(host.agent.running) == [f"box-workers-{k}@box" for k in range(1, 5)]
    gpus = {name: host.given[name]["CUDA_VISIBLE_DEVICES"] for name in host.agent.running}
    assert sorted(gpus.values()) == ["0", "1", "2", "3"]
    assert all(host.given[name]["NVIDIA_VISIBLE_DEVICES"] == gpu for name, gpu in gpus.items())
    assert HostDevices(tmp_path / "devices", host_gpus(4, {})).claim("replica iris:9000", 1) is None

    # A node that dies is started again on its own GPU.
    dead = "box-workers-2@box"
    host.agent.running[dead].code = -9  # type: ignore[attr-defined]
    host.agent.step(T0 + 1)
    assert host.given[dead]["CUDA_VISIBLE_DEVICES"] == gpus[dead] and len(host.agent.running) == 4

    # Fewer wanted: one idle node stops for good after the grace, and its GPU goes to the next one.
    host.plan(3, at=T0 + 2)
    host.all_registered(T0 + 2)
    host.agent.step(T0 + 2)
    host.plan(3, at=T0 + 3 + GRACE_S)
    host.agent.step(T0 + 3 + GRACE_S)
    [(stopped, process)] = host.agent.stopping.items()
    process.code = 0  # type: ignore[attr-defined]
    host.plan(5, at=T0 + 4 + GRACE_S)
    host.agent.step(T0 + 4 + GRACE_S)
    assert len(host.agent.running) == 4
    assert host.given[stopped]["CUDA_VISIBLE_DEVICES"] == gpus[stopped]  # started again, on the freed GPU
    assert sorted(host.given[name]["CUDA_VISIBLE_DEVICES"] for name in host.agent.running) == ["0", "1", "2", "3"]


def test_each_node_of_an_inferentia_host_gets_neuron_cores_of_its_own(tmp_path) -> None:
    """`sluice workers --queues inf --inf 4 --inf-per-node 2`: two nodes of two cores each, a third waits."""
    cores = HostDevices(tmp_path / "devices", host_cores(4, {}), kind=NEURON)
    host = Host(min_nodes=3, inf=4, cores=cores)
    host.agent.step(T0)
    assert sorted(host.given[name]["NEURON_RT_VISIBLE_CORES"] for name in host.agent.running) == ["0,1", "2,3"]
    assert all("CUDA_VISIBLE_DEVICES" not in host.given[name] for name in host.agent.running)
    assert len(host.agent.running) == 2
    assert host.hosts.all()[0].offers.inf == 4  # announced: placement counts them


@pytest.mark.parametrize(("options", "named"), [
    ({"queues": ()}, "--queues"), ({"min_nodes": -1}, "--min-nodes"), ({"idle_grace_s": -1.0}, "--idle-grace"),
    ({"host_id": "a b"}, "--host-id"), ({"gpus_per_node": 0}, "--gpus-per-node"),
    ({"inf_per_node": 0}, "--inf-per-node"),
])
def test_options_that_cannot_work_are_refused_by_name(options: dict[str, object], named: str) -> None:
    arguments: dict[str, object] = {"host_id": "box", "queues": ("cpu",), "offers": Resources(), **options}
    with pytest.raises(BadAgentOption, match=named):
        AgentConfig(**arguments)  # type: ignore[arg-type]
