"""The node registry in memory, for fast tests of placement, settling and the batch path.

It keeps `NodeRegistry`'s contract (`tests/unit/test_nodes_contract.py`, and against Redis's
`Nodes` in tests/integration/). Its in-flight hashes are shared with the in-memory batch ledger,
which enters and removes batches there as Redis's scripts do: build it with `inflight=store.inflight`.
Production code never imports it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from jobs.nodes.registry import Heartbeats, heartbeat_record, live_and_dead
from jobs.placement.node_plan import HostPlan, NodePlan, Shortfall, WorkerHostReport
from jobs.transport.delivery import Delivery


class MemoryNodes:
    """`NodeRegistry` in dicts; every call takes one lock."""

    def __init__(self, node_ttl_s: float, inflight: dict[str, dict[str, str]] | None = None) -> None:
        self.node_ttl_s = node_ttl_s
        self._lock = threading.RLock()
        self._heartbeats: Heartbeats = {}
        self._inflight = inflight if inflight is not None else {}

    def heartbeat(self, node: str, queues: list[str], now: float) -> None:
        with self._lock:
            self._heartbeats[node] = heartbeat_record(queues, now)

    def forget(self, node: str) -> None:
        with self._lock:
            self._heartbeats.pop(node, None)

    def heartbeats(self) -> Heartbeats:
        with self._lock:
            return {name: {"queues": list(r["queues"]), "seen": r["seen"]} for name, r in self._heartbeats.items()}

    def live(self, now: float, heartbeats: Heartbeats | None = None) -> dict[str, list[str]]:
        live, dead = live_and_dead(self.heartbeats() if heartbeats is None else heartbeats, now, self.node_ttl_s)
        for name in dead:
            self.forget(name)
        return live

    def begin_delivery(self, delivery: Delivery, entry: str) -> None:
        with self._lock:
            self._inflight.setdefault(delivery.node, {})[delivery.task_id] = entry

    def end_delivery(self, delivery: Delivery) -> None:
        with self._lock:
            self._inflight.get(delivery.node, {}).pop(delivery.task_id, None)

    def inflight(self, node: str) -> dict[str, str]:
        with self._lock:
            return dict(self._inflight.get(node, {}))

    def inflight_nodes(self) -> list[str]:
        """Like Redis, a node whose hash was emptied has none."""
        with self._lock:
            return sorted(node for node, entries in self._inflight.items() if entries)

    def forget_inflight(self, node: str, task_ids: Iterable[str]) -> None:
        with self._lock:
            entries = self._inflight.get(node, {})
            for task_id in list(task_ids):
                entries.pop(task_id, None)


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
            self._plan = NodePlan({h: p for h, p in self._plan.hosts.items() if h != host_id}, dict(self._plan.notes),
                                  dict(self._plan.shortfall))

    def reports(self) -> dict[str, WorkerHostReport]:
        with self._lock:
            return dict(self._reports)

    def write_plan(self, plan: NodePlan) -> None:
        with self._lock:
            self._plan = NodePlan(dict(plan.hosts), dict(plan.notes), dict(plan.shortfall))

    def plan_of(self, host_id: str) -> HostPlan | None:
        with self._lock:
            return self._plan.hosts.get(host_id)

    def note_of(self, job_id: str) -> str | None:
        with self._lock:
            return self._plan.notes.get(job_id)

    def plans(self) -> dict[str, HostPlan]:
        with self._lock:
            return dict(self._plan.hosts)

    def shortfall(self) -> dict[str, Shortfall]:
        with self._lock:
            return dict(self._plan.shortfall)
