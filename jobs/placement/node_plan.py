"""How many worker nodes each worker host should run, so that a batch job gets the `workers` it asks for
and an AsyncAPI the nodes its scaler wants.

A worker host's agent (`sluice workers`, `sluice/worker_host.py`) keeps at least `--min-nodes` nodes
and reports them (`WorkerHostReport`). Beat, which already places jobs on live nodes
(`jobs/placement/batch.py`), plans after each placement: per hardware queue, the jobs want as many nodes as
the largest `workers` among them (placement lets jobs share a node, least loaded first, so a job of
`workers: 3` has its 3 nodes once 3 serve its queue, whatever else runs there). Nodes live or
starting serve that demand first; what is missing is started on the hosts with room, the one with
the most room first (so starts spread), each new node taking the compute of the jobs it is for. A
host's room is what it offers less what its nodes take: a node takes the compute of the jobs placed
on it (per resource, the largest), and a node serving no job the compute of the node being fitted.

An AsyncAPI is demand of the same kind (`AsyncWant`): its scaler's count (`jobs/scaling/asyncapi.py`,
kept in `Placed.desired`) is its `workers`, and its placed nodes are its nodes, since async placement
shares nodes with jobs as job placement does (`jobs/placement/asyncapi.py`). So an API scaled up past
the live nodes of its queue, or from 0 on hosts that keep `--min-nodes 0`, gets nodes started; once
it scales down its extra nodes are placed on nothing, and the agent stops them after its grace.

What fits nowhere leaves the job on fewer nodes, and the plan says why, in the job's words
("running on 1 of 3 workers: no host has room for 2 more nodes of 1 cpu"); an AsyncAPI short of nodes
is told in beat's log and by `sluice get` (desired against placed). The plan also names each
host's busy nodes (placed on a job or an AsyncAPI, or holding a delivery): the agent stops only
nodes not busy, after its idle grace, and never below its minimum.

Everything here is a pure function of what beat read, so tests drive it with fixed values.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import Any

from foundation.hosts import HostRecord, Resources, cpu_millis, mem_bytes

# A plan older than this many seconds is beat's no longer (beat stopped): an agent then holds what it has.
PLAN_TTL_S = 30.0


@dataclass(frozen=True)
class WorkerHostReport:
    """What a worker host's agent runs, as it reports every heartbeat; `to_dict()` is the stored form."""

    host_id: str
    queues: tuple[str, ...]   # the hardware queues its nodes serve
    min_nodes: int            # nodes it keeps however idle
    nodes: tuple[str, ...]    # its nodes' Celery names, running or starting
    seen: float

    def to_dict(self) -> dict[str, Any]:
        return {"host_id": self.host_id, "queues": list(self.queues), "min_nodes": self.min_nodes,
                "nodes": list(self.nodes), "seen": self.seen}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> WorkerHostReport:
        return cls(str(d["host_id"]), tuple(str(q) for q in d["queues"]), int(d["min_nodes"]),
                   tuple(str(n) for n in d["nodes"]), float(d["seen"]))


@dataclass(frozen=True)
class HostPlan:
    """What beat wants of one worker host: run at least `target` nodes; `busy` ones are in use.
    `holds` says whether the host holds anything beyond its idle minimum (busy nodes, or nodes
    starting for a demand): a host that holds nothing is the one to remove when hosts are scaled in
    (`jobs/placement/host_demand.py`, `sluice/pod_deletion_cost.py`)."""

    target: int
    busy: tuple[str, ...]
    at: float
    holds: bool = False
    # What its nodes take of its room (those placed, and those started for a demand): what a replica
    # host sharing its room cannot have (`HostRecord.room`).
    takes: Resources = field(default_factory=Resources)

    def fresh(self, now: float, ttl_s: float = PLAN_TTL_S) -> bool:
        return now - self.at <= ttl_s

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "busy": list(self.busy), "at": self.at, "holds": self.holds,
                "takes": self.takes.to_dict()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> HostPlan:
        return cls(int(d["target"]), tuple(str(n) for n in d["busy"]), float(d["at"]), bool(d.get("holds", False)),
                   Resources.from_dict(d.get("takes") or {}))


@dataclass(frozen=True)
class Shortfall:
    """Nodes of one hardware queue that fit on no live worker host: `count` of them, each of `need`."""

    count: int
    need: Resources

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, **self.need.to_dict()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Shortfall:
        return cls(int(d["count"]), Resources.from_dict(d))


@dataclass(frozen=True)
class JobWant:
    """An active job as the plan sees it: its queue, `workers`, the compute each of its nodes takes,
    and the nodes placement has given it."""

    job_id: str
    queue: str
    workers: int
    compute: Resources
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class AsyncWant:
    """A deployed AsyncAPI as the plan sees it: its hardware queue, the node count its scaler wants,
    the compute each of its nodes takes, and the nodes placement has given it."""

    api_name: str
    queue: str
    desired: int
    compute: Resources
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class _Demand:
    """A job or an AsyncAPI wanting `count` nodes of `queue`, each of `compute`."""

    queue: str
    count: int
    compute: Resources


@dataclass(frozen=True)
class NodePlan:
    """Host id -> its plan; job id -> why it runs on fewer nodes than it asked (only such jobs);
    hardware queue -> the nodes that fit nowhere (only queues short of room)."""

    hosts: dict[str, HostPlan] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    shortfall: dict[str, Shortfall] = field(default_factory=dict)


def node_compute(compute: Mapping[str, Any] | None) -> Resources:
    """What one node of an API takes, from its `compute` section (Cortex's default: 1 cpu)."""
    compute = compute or {}
    return Resources(cpu_millis(compute.get("cpu", 1)), mem_bytes(compute.get("mem") or 0), int(compute.get("gpu", 0)),
                     int(compute.get("inf", 0)))


def describe(shape: Resources) -> str:
    """A node's size as a user reads it: "1 cpu", "500m cpu, 2Gi mem, 1 gpu"."""
    cpu = f"{shape.cpu_m // 1000} cpu" if shape.cpu_m % 1000 == 0 else f"{shape.cpu_m}m cpu"
    parts = [cpu]
    if shape.mem:
        parts.append(f"{shape.mem / 2**30:g}Gi mem" if shape.mem >= 2**30 else f"{-(-shape.mem // 2**20)}Mi mem")
    if shape.gpu:
        parts.append(f"{shape.gpu} gpu")
    if shape.inf:
        parts.append(f"{shape.inf} inf")
    return ", ".join(parts)


def _largest(shapes: Iterable[Resources]) -> Resources:
    largest = Resources()
    for s in shapes:
        largest = Resources(max(largest.cpu_m, s.cpu_m), max(largest.mem, s.mem), max(largest.gpu, s.gpu),
                            max(largest.inf, s.inf))
    return largest


_UNBOUNDED = 10**6  # a node that takes nothing fits anywhere (compute always asks some cpu, though)


def _nodes(count: int) -> str:
    return f"{count} more node{'s' if count != 1 else ''}"


@dataclass
class _Host:
    record: HostRecord
    report: WorkerHostReport
    footprints: dict[str, Resources]  # its nodes placed on jobs -> what each takes
    starts: int = 0
    taken: Resources = field(default_factory=Resources)  # what replicas sharing its room take
    start_shape: Resources = field(default_factory=Resources)

    def room_for(self, shape: Resources) -> int:
        """How many more nodes of `shape` fit, counting its unplaced nodes (and those planned) as `shape`."""
        unplaced = len(self.report.nodes) - len(self.footprints) + self.starts
        free = self.record.offers - sum(self.footprints.values(), Resources()) - self.taken
        fits = [(have - unplaced * need) // need
                for have, need in ((free.cpu_m, shape.cpu_m), (free.mem, shape.mem), (free.gpu, shape.gpu),
                                   (free.inf, shape.inf)) if need]
        return max(min(fits), 0) if fits else _UNBOUNDED


def plan_nodes(
    hosts: Sequence[tuple[HostRecord, WorkerHostReport]],
    jobs: Sequence[JobWant],
    live: Mapping[str, Sequence[str]],
    busy: Set[str],
    now: float,
    apis: Sequence[AsyncWant] = (),
    taken: Mapping[str, Resources] | None = None,
) -> NodePlan:
    """The plan for every worker host, from the live hosts with their agents' reports, the active jobs,
    the live nodes (name -> hardware queues), the nodes in use (`busy`), the deployed AsyncAPIs, and
    what replicas take of the hosts whose room they share (`taken`: host id -> room)."""
    placed = [(job.nodes, job.compute) for job in jobs] + [(api.nodes, api.compute) for api in apis]
    footprint: dict[str, Resources] = {}
    for placed_nodes, compute in placed:
        for node in placed_nodes:
            footprint[node] = _largest([footprint.get(node, Resources()), compute])
    demands = ([_Demand(job.queue, job.workers, job.compute) for job in jobs]
               + [_Demand(api.queue, api.desired, api.compute) for api in apis])
    views = [
        _Host(record, report, {n: footprint[n] for n in report.nodes if n in footprint},
              taken=(taken or {}).get(record.host_id, Resources()))
        for record, report in sorted(hosts, key=lambda pair: pair[0].host_id)
    ]
    notes: dict[str, str] = {}
    shortfall: dict[str, Shortfall] = {}
    for queue in sorted({demand.queue for demand in demands}):
        on_queue = [job for job in jobs if job.queue == queue]
        serving = [h for h in views if queue in h.report.queues]
        starting = {n for h in serving for n in h.report.nodes if n not in live}
        supply = len([n for n, queues in live.items() if queue in queues]) + len(starting)
        wanting = [d for d in demands if d.queue == queue and d.count > supply]
        new = 0
        if wanting:
            shape = _largest(d.compute for d in wanting)
            missing = max(d.count for d in wanting) - supply
            for _ in range(missing):
                best = max(serving, key=lambda h: (h.room_for(shape), -views.index(h)), default=None)
                if best is None or best.room_for(shape) == 0:
                    break
                best.starts += 1
                best.start_shape = best.start_shape + shape
                new += 1
            if missing > new:
                shortfall[queue] = Shortfall(missing - new, shape)
        for job in on_queue:
            if len(job.nodes) < job.workers:
                notes[job.job_id] = _note(job, queue, bool(serving), len(starting) + new,
                                          job.workers - supply - new)
    plans = {}
    for h in views:
        kept = [n for n in h.report.nodes if n in busy or n not in live]
        busy_here = tuple(n for n in h.report.nodes if n in busy)
        # Starting nodes beyond its minimum were started for a demand, as those planned now are.
        starting_for_demand = len(h.report.nodes) > h.report.min_nodes and any(n not in live for n in h.report.nodes)
        plans[h.record.host_id] = HostPlan(
            max(h.report.min_nodes, len(kept) + h.starts), busy_here, now,
            holds=bool(busy_here) or h.starts > 0 or starting_for_demand,
            takes=sum(h.footprints.values(), Resources()) + h.start_shape)
    return NodePlan(plans, notes, shortfall)


def _note(job: JobWant, queue: str, served: bool, starting: int, lacking: int) -> str:
    """Why `job` runs on fewer nodes than its `workers`: nodes still starting, or `lacking` that fit nowhere."""
    head = f"running on {len(job.nodes)} of {job.workers} workers"
    if lacking > 0 and not served:
        return f"{head}: no worker host (`sluice workers`) serves queue {queue}, so no node can be started for it"
    if lacking > 0:
        return f"{head}: no host has room for {_nodes(lacking)} of {describe(job.compute)}"
    if starting:
        return f"{head}: {starting} node{'s' if starting != 1 else ''} starting"
    return f"{head}: waiting for placement to give it the free nodes"
