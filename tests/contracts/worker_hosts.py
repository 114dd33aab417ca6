"""The contract of worker hosts' reports and beat's plan for them (`jobs.nodes.worker_hosts.WorkerHosts`).

Fixtures a subclass provides: `worker_hosts` (empty).
"""

from __future__ import annotations

from foundation.hosts import Resources
from jobs.nodes.worker_hosts import WorkerHosts
from jobs.placement.node_plan import HostPlan, NodePlan, Shortfall, WorkerHostReport

NOW = 1_700_000_000.0


def report(host_id: str = "box-workers", nodes: tuple[str, ...] = ("box-workers-1@box",)) -> WorkerHostReport:
    return WorkerHostReport(host_id, ("cpu", "gpu"), 1, nodes, NOW)


class WorkerHostsContract:
    def test_a_report_reads_back_whole_and_each_heartbeat_rewrites_it(self, worker_hosts: WorkerHosts) -> None:
        worker_hosts.report(report())
        worker_hosts.report(report(nodes=("box-workers-1@box", "box-workers-2@box")))

        assert worker_hosts.reports() == {"box-workers": report(nodes=("box-workers-1@box", "box-workers-2@box"))}

    def test_a_plan_replaces_the_last_one_whole_hosts_and_notes_alike(self, worker_hosts: WorkerHosts) -> None:
        worker_hosts.write_plan(NodePlan({"a": HostPlan(3, ("a-1",), NOW), "b": HostPlan(1, (), NOW)},
                                         {"j1": "running on 1 of 3 workers: 2 nodes starting"}))
        worker_hosts.write_plan(NodePlan({"a": HostPlan(1, (), NOW + 1)}, {}))

        assert worker_hosts.plan_of("a") == HostPlan(1, (), NOW + 1)
        assert worker_hosts.plan_of("b") is None
        assert worker_hosts.note_of("j1") is None

    def test_a_note_reads_back_as_written(self, worker_hosts: WorkerHosts) -> None:
        note = "running on 1 of 3 workers: no host has room for 2 more nodes of 1 cpu"
        worker_hosts.write_plan(NodePlan({}, {"j1": note}))

        assert worker_hosts.note_of("j1") == note

    def test_a_host_removed_has_neither_report_nor_plan(self, worker_hosts: WorkerHosts) -> None:
        worker_hosts.report(report())
        worker_hosts.write_plan(NodePlan({"box-workers": HostPlan(2, (), NOW)}, {}))

        worker_hosts.remove("box-workers")

        assert worker_hosts.reports() == {}
        assert worker_hosts.plan_of("box-workers") is None

    def test_every_plan_and_the_shortfall_read_back_and_are_replaced_whole(self, worker_hosts: WorkerHosts) -> None:
        gpu_node = Resources.parse(cpu=1, mem="4Gi", gpu=1)
        worker_hosts.write_plan(NodePlan({"a": HostPlan(2, ("a-1",), NOW, holds=True), "b": HostPlan(1, (), NOW)},
                                         {}, {"gpu": Shortfall(3, gpu_node)}))

        assert worker_hosts.plans() == {"a": HostPlan(2, ("a-1",), NOW, holds=True), "b": HostPlan(1, (), NOW)}
        assert worker_hosts.shortfall() == {"gpu": Shortfall(3, gpu_node)}

        worker_hosts.write_plan(NodePlan({"b": HostPlan(1, (), NOW + 1)}, {}))

        assert worker_hosts.plans() == {"b": HostPlan(1, (), NOW + 1)}
        assert worker_hosts.shortfall() == {}
