"""Beat's step that plans worker nodes: reads what placement did, what worker hosts run and offer,
and leaves each host its plan and each short job its note (`jobs/node_plan.py`).

It runs right after job placement, so that a free node has already been given to the jobs that
lack one before any node is started for them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from foundation.errors import JobNotFound
from foundation.hosts import HostDirectory
from jobs.job import ACTIVE_STATUSES, BAD_RECORD_ERRORS
from jobs.node_plan import JobWant, NodePlan, node_compute, plan_nodes
from jobs.nodes import NodeRegistry
from jobs.store import JobRecords
from jobs.worker_hosts import WorkerHosts

log = logging.getLogger(__name__)

WORKERS_ROLE = "workers"  # the role a worker host's agent announces (`foundation.hosts.HostRecord.roles`)


def active_wants(store: JobRecords) -> list[JobWant]:
    """Every active job as the plan sees it; a record that cannot be read is logged and left out."""
    wants = []
    for job_id in store.active_ids():
        try:
            state = store.state(job_id)
            if state.status not in ACTIVE_STATUSES:
                continue
            job = state.job
            wants.append(JobWant(job.job_id, job.hardware_queue, int(job.workers),
                                 node_compute(job.api_spec.get("compute")), tuple(state.nodes)))
        except JobNotFound:  # ended and expired since it was listed
            continue
        except BAD_RECORD_ERRORS:  # its compute or record is unreadable: the other jobs are planned
            log.exception("plan-worker-nodes: skipping job %s, whose record could not be read", job_id)
    return wants


def plan_worker_nodes(
    store: JobRecords, nodes: NodeRegistry, hosts: HostDirectory, worker_hosts: WorkerHosts,
    async_nodes: Callable[[], Iterable[str]], now: float,
) -> NodePlan:
    """One step: plan every live worker host's nodes and write the plan (with the jobs' notes) at once.

    `async_nodes()`: the nodes placed on an AsyncAPI (busy, as those placed on a job are)."""
    reports = worker_hosts.reports()
    live_hosts = [(record, reports[record.host_id]) for record in hosts.live(now)
                  if WORKERS_ROLE in record.roles and record.host_id in reports]
    wants = active_wants(store)
    busy = {n for want in wants for n in want.nodes} | set(async_nodes())
    busy |= {n for n in nodes.inflight_nodes() if nodes.inflight(n)}
    plan = plan_nodes(live_hosts, wants, nodes.live(now), busy, now)
    worker_hosts.write_plan(plan)
    for host_id, host_plan in plan.hosts.items():
        if host_plan.target > len(reports[host_id].nodes):
            log.info("worker host %s: %d node(s) wanted, %d running or starting", host_id, host_plan.target,
                     len(reports[host_id].nodes), extra={"host_id": host_id, "target": host_plan.target})
    return plan
