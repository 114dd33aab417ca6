"""Where each RealtimeAPI's replicas run: placed on the room the live hosts offer.

Every host's agent announces what it offers (`foundation/hosts.py`); each RealtimeAPI wants the
count its scaler last decided (`foundation/replica_scale.py`), or its `init_replicas` before any
decision, each replica taking the API's `compute` (cpu, mem, gpu). Placement decides how many
replicas of each API each host runs (`foundation/replica_placement.py`); the hosts' replica
managers run that many launchers. Beat runs `reconcile` every step, and the API runs it at deploy,
so a new API's first replica does not wait for beat.

The rules, in order:
- **Stable**: a replica placed on a live host of its hardware stays there while it fits; nothing
  running is moved to rebalance. Scaling down takes replicas from the host that runs the most of
  the API first (so what is left stays spread).
- **Spread, then pack**: a new replica goes to an eligible host with the fewest replicas of its
  API; among those, to the one with the least room left that still holds it (so big free hosts
  stay free for big replicas).
- **Hardware**: an API with `compute.gpu > 0` goes only to hosts offering GPUs and not limited to
  CPU APIs (`sluice replicas --cpu`); the others only to hosts not limited to GPU APIs (`--gpu`).
- **Pending**: what fits nowhere is counted as pending with a reason ("no host has 1 gpu free").
- **Dead hosts**: a host whose heartbeat stopped (or whose agent stopped) is not live; its
  replicas are placed again on the others at the next step.

`place_replicas` is the pure part (hosts, wants and the current placement in, the new placement
out); `RealtimePlacement` reads and writes the records around it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from foundation.api_kinds import ApiKind
from foundation.api_registry import ApiRegistry, DeployedApi
from foundation.hosts import HOST_TTL_S, HostDirectory, HostRecord, Resources, shared_room
from foundation.replica_placement import PlacedReplicas, ReplicaAssignments
from foundation.replica_scale import ScaleBook
from jobs.nodes.worker_hosts import WorkerHosts
from jobs.scaling.config import autoscaling_of
from predictors_runtime.config import ApiConfig

log = logging.getLogger(__name__)

REPLICAS_ROLE = "replicas"
WORKERS_ROLE = "workers"


@dataclass(frozen=True)
class Want:
    """What one RealtimeAPI asks of placement: how many replicas, each taking `need`."""

    api: str
    desired: int
    need: Resources
    hardware: str  # "gpu" when each replica takes a GPU, else "cpu"


def replica_need(deployed: DeployedApi) -> Resources:
    """What one replica of the API takes: its `compute` (cpu default 200m as in Cortex, mem 0)."""
    compute = ApiConfig.from_dict(deployed.spec).compute
    return Resources.parse(cpu=compute.cpu, mem=compute.mem or 0, gpu=compute.gpu, inf=compute.inf)


def serves(host: HostRecord, hardware: str) -> bool:
    """Whether the host takes replicas of APIs of this hardware."""
    return REPLICAS_ROLE in host.roles and host.hardware in (None, hardware)


def _pending_reason(want: Want, hosts: list[HostRecord], room: dict[str, Resources]) -> str:
    eligible = [h for h in hosts if serves(h, want.hardware)]
    if not eligible:
        limit = "" if not hosts else f" for {want.hardware} APIs"
        return f"no live host offers room to replicas{limit}"
    roomiest = max(eligible, key=lambda h: (room[h.host_id].gpu, room[h.host_id].inf, room[h.host_id].cpu_m,
                                            room[h.host_id].mem))
    return f"no host has {want.need.shortfall(room[roomiest.host_id])} free"


def place_replicas(wants: list[Want], hosts: list[HostRecord], current: dict[str, PlacedReplicas],
                   taken: Mapping[str, Resources] | None = None) -> dict[str, PlacedReplicas]:
    """The new placement of every wanted API on the live `hosts`, keeping what `current` holds
    where it still may run (the rules are in the module's docstring); `taken` is what worker nodes
    take of hosts whose room they share (host id -> room)."""
    by_id = {h.host_id: h for h in hosts}
    room = {h.host_id: h.offers - (taken or {}).get(h.host_id, Resources()) for h in hosts}
    counts: dict[str, dict[str, int]] = {}
    ordered = sorted(wants, key=lambda w: w.api)
    for want in ordered:  # first what stays: every API's running replicas before any new one
        kept: dict[str, int] = {}
        before = current.get(want.api, PlacedReplicas()).hosts
        for host_id, n in sorted(before.items()):
            host = by_id.get(host_id)
            if host is None or not serves(host, want.hardware):
                continue
            while n > 0 and want.need.fits_in(room[host_id]):
                room[host_id] -= want.need
                kept[host_id] = kept.get(host_id, 0) + 1
                n -= 1
        while sum(kept.values()) > want.desired:  # scale down from the most loaded host
            host_id = max(kept, key=lambda h: (kept[h], h))
            kept[host_id] -= 1
            room[host_id] += want.need
            if kept[host_id] == 0:
                del kept[host_id]
        counts[want.api] = kept
    placed: dict[str, PlacedReplicas] = {}
    for want in ordered:  # then what is new, spread first and packed second
        kept = counts[want.api]
        reason = ""
        while sum(kept.values()) < want.desired:
            fitting = [h for h in hosts if serves(h, want.hardware) and want.need.fits_in(room[h.host_id])]
            if not fitting:
                reason = _pending_reason(want, hosts, room)
                break
            left = {h.host_id: room[h.host_id] - want.need for h in fitting}
            best = min(fitting, key=lambda h: (kept.get(h.host_id, 0), left[h.host_id].gpu,
                                               left[h.host_id].cpu_m, left[h.host_id].mem, h.host_id))
            room[best.host_id] -= want.need
            kept[best.host_id] = kept.get(best.host_id, 0) + 1
        pending = want.desired - sum(kept.values())
        placed[want.api] = PlacedReplicas(dict(sorted(kept.items())), want.desired, pending, reason)
    return placed


class RealtimePlacement:
    """Places every RealtimeAPI's replicas on the live hosts (beat's step, and the API at deploy)."""

    def __init__(self, registry: ApiRegistry, hosts: HostDirectory, book: ScaleBook,
                 assignments: ReplicaAssignments, host_ttl_s: float = HOST_TTL_S,
                 worker_hosts: WorkerHosts | None = None) -> None:
        """`worker_hosts`: beat's plans of the worker hosts, whose nodes take room from a replica host
        sharing a machine with one (`HostRecord.room`)."""
        self._registry = registry
        self._worker_hosts = worker_hosts
        self._hosts = hosts
        self._host_ttl_s = host_ttl_s  # a host silent this long loses its replicas to the others
        self._book = book
        self.assignments = assignments

    def wants(self) -> list[Want]:
        """Each RealtimeAPI's count: its scaler's last decision, else its `init_replicas`."""
        decided = self._book.all()
        wants = []
        for api in self._registry.all():
            if api.kind != ApiKind.REALTIME:
                continue
            scale = decided.get(api.name)
            desired = scale.desired if scale is not None else autoscaling_of(api).init_replicas
            wants.append(Want(api.name, desired, replica_need(api), "gpu" if api.queue == "gpu" else "cpu"))
        return wants

    def _taken_by_nodes(self, live: list[HostRecord]) -> dict[str, Resources]:
        """What the worker nodes of a machine take from its replica host, by beat's last plan."""
        if self._worker_hosts is None or not any(h.room for h in live):
            return {}
        nodes_on = {}
        for record in live:
            if record.room and WORKERS_ROLE in record.roles:
                plan = self._worker_hosts.plan_of(record.host_id)
                if plan is not None:
                    nodes_on[record.host_id] = plan.takes
        return shared_room(live, REPLICAS_ROLE, nodes_on)

    def reconcile(self, now: float) -> dict[str, PlacedReplicas]:
        """One step: place every RealtimeAPI, forget deleted ones; returns the new placement."""
        current = self.assignments.all()
        live = self._hosts.live(now, self._host_ttl_s)
        hosts = [h for h in live if REPLICAS_ROLE in h.roles]
        placed = place_replicas(self.wants(), hosts, current, self._taken_by_nodes(live))
        for name, record in placed.items():
            before = current.get(name)
            if before != record:
                if before is None or before.hosts != record.hosts:
                    log.info("realtime api %s: %d wanted, placed %s%s", name, record.desired, record.hosts,
                             f"; {record.pending} pending: {record.reason}" if record.pending else "")
                self.assignments.set(name, record)
        for name in sorted(set(current) - set(placed)):
            log.info("realtime api %s is gone: no host runs it", name)
            self.assignments.forget(name)
        return placed
