"""Beat's step that plans worker nodes: reads what placement did, what worker hosts run and offer,
and leaves each host its plan and each short job its note (`jobs/placement/node_plan.py`).

It runs right after job placement and AsyncAPI placement, so that a free node has already been
given to the jobs and APIs that lack one before any node is started for them, and an AsyncAPI's
count just decided by its scaler (woken from 0 by a request, say) is planned in the same step.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from foundation.api_kinds import ApiKind
from foundation.api_registry import ApiRegistry, DeployedApi
from foundation.errors import JobNotFound
from foundation.hosts import HOST_TTL_S, HostDirectory, HostRecord, Resources, shared_room
from foundation.replica_placement import ReplicaAssignments
from jobs.batch.job import ACTIVE_STATUSES, BAD_RECORD_ERRORS
from jobs.nodes.registry import NodeRegistry
from jobs.nodes.worker_hosts import WorkerHosts
from jobs.placement.asyncapi import AsyncAssignments, Placed
from jobs.placement.node_plan import AsyncWant, JobWant, NodePlan, node_compute, plan_nodes
from jobs.placement.realtime import replica_need
from jobs.store import JobRecords

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


def async_wants(apis: Iterable[DeployedApi], placed: Mapping[str, Placed]) -> list[AsyncWant]:
    """Every deployed AsyncAPI that placement has seen, wanting the count its scaler last decided
    (`Placed.desired`); one whose compute cannot be read is logged and left out."""
    wants = []
    for api in apis:
        current = placed.get(api.name)
        if api.kind != ApiKind.ASYNC or current is None:  # deployed since placement last ran: its next step plans it
            continue
        try:
            compute = node_compute(api.spec.get("compute"))
        except (ValueError, TypeError, AttributeError):
            log.exception("plan-worker-nodes: skipping async api %s, whose compute could not be read", api.name)
            continue
        wants.append(AsyncWant(api.name, api.queue, current.desired, compute, tuple(current.nodes)))
    return wants


def replicas_taking(live: list[HostRecord], registry: ApiRegistry,
                    replicas: ReplicaAssignments) -> dict[str, Resources]:
    """What the realtime replicas of a machine take from its worker host (`HostRecord.room`)."""
    if not any(record.room for record in live):
        return {}
    needs = {api.name: replica_need(api) for api in registry.all() if api.kind == ApiKind.REALTIME}
    on: dict[str, Resources] = {}
    for api_name, placed in replicas.all().items():
        need = needs.get(api_name)
        if need is None:
            continue
        for host_id, count in placed.hosts.items():
            for _ in range(count):
                on[host_id] = on.get(host_id, Resources()) + need
    return shared_room(live, WORKERS_ROLE, on)


def plan_worker_nodes(
    store: JobRecords, nodes: NodeRegistry, hosts: HostDirectory, worker_hosts: WorkerHosts,
    registry: ApiRegistry, assignments: AsyncAssignments, now: float, host_ttl_s: float = HOST_TTL_S,
    replicas: ReplicaAssignments | None = None,
) -> NodePlan:
    """One step: plan every live worker host's nodes and write the plan (with the jobs' notes) at once.

    The nodes placed on an AsyncAPI are busy, as those placed on a job are (a deleted API's too,
    while it drains); a deployed AsyncAPI wants the nodes its scaler decided (`async_wants`)."""
    reports = worker_hosts.reports()
    live = hosts.live(now, host_ttl_s)
    live_hosts = [(record, reports[record.host_id]) for record in live
                  if WORKERS_ROLE in record.roles and record.host_id in reports]
    wants = active_wants(store)
    placed = assignments.placed()
    apis = async_wants(registry.all(), placed)
    busy = {n for want in wants for n in want.nodes} | {n for p in placed.values() for n in p.nodes}
    busy |= {n for n in nodes.inflight_nodes() if nodes.inflight(n)}
    taken = replicas_taking(live, registry, replicas) if replicas is not None else {}
    plan = plan_nodes(live_hosts, wants, nodes.live(now), busy, now, apis, taken)
    worker_hosts.write_plan(plan)
    for host_id, host_plan in plan.hosts.items():
        if host_plan.target > len(reports[host_id].nodes):
            log.info("worker host %s: %d node(s) wanted, %d running or starting", host_id, host_plan.target,
                     len(reports[host_id].nodes), extra={"host_id": host_id, "target": host_plan.target})
    return plan
