"""Worker hosts' reports and beat's plan in memory, for fast tests of planning and of the agent.

It keeps `WorkerHosts`' contract (`tests/contracts/worker_hosts.py`, run here and against Redis's
`RedisWorkerHosts`). Production code never imports it.
"""

from __future__ import annotations

import threading

from .node_plan import HostPlan, NodePlan, WorkerHostReport


class MemoryWorkerHosts:
    """`WorkerHosts` in dicts; every call takes one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reports: dict[str, WorkerHostReport] = {}
        self._plan = NodePlan()

    def report(self, report: WorkerHostReport) -> None:
        with self._lock:
            self._reports[report.host_id] = report

    def remove(self, host_id: str) -> None:
        with self._lock:
            self._reports.pop(host_id, None)
            self._plan = NodePlan({h: p for h, p in self._plan.hosts.items() if h != host_id}, dict(self._plan.notes))

    def reports(self) -> dict[str, WorkerHostReport]:
        with self._lock:
            return dict(self._reports)

    def write_plan(self, plan: NodePlan) -> None:
        with self._lock:
            self._plan = NodePlan(dict(plan.hosts), dict(plan.notes))

    def plan_of(self, host_id: str) -> HostPlan | None:
        with self._lock:
            return self._plan.hosts.get(host_id)

    def note_of(self, job_id: str) -> str | None:
        with self._lock:
            return self._plan.notes.get(job_id)
