"""A RealtimeAPI's replicas as `GET /apis/<name>`, `sluice get` and `/metrics` show them.

Three records meet here, each written by a different part: the scale book (the count the realtime
scaler decided and the in-flight figure it decided on, `foundation/replica_scale.py`), the
placement (replicas per host and what fits nowhere, `foundation/replica_placement.py`) and the
replica directory (what the launchers announce, `foundation/replica_directory.py`). Putting them
side by side answers the operator's questions: how many are wanted, where, how many serve, and
why the others do not.

A replica is counted ready on the placement host whose agent started it (the launcher announces
that host id); one started by hand (`sluice serve`) counts in the total only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from foundation.api_kinds import ApiKind
from foundation.api_registry import DeployedApi
from foundation.replica_directory import ReplicaRecord
from foundation.replica_placement import PlacedReplicas
from foundation.replica_scale import ReplicaScale
from jobs.scaling.config import autoscaling_of


@dataclass(frozen=True)
class HostReplicas:
    """One placement host's share of an API: replicas assigned to it, and those of them serving."""

    desired: int
    ready: int


@dataclass(frozen=True)
class RealtimeCounts:
    """One RealtimeAPI's replicas: wanted, serving, starting, placed nowhere, per host."""

    desired: int           # what placement was asked for (the scaler's count, else init_replicas)
    ready: int             # live, every process ready, not draining: taking requests
    starting: int          # placed on a host, not ready yet
    pending: int           # wanted but placed on no host
    pending_reason: str    # why they are pending ("" when none is)
    in_flight: float       # the window-averaged requests the scaler's last decision saw (0 before any)
    hosts: dict[str, HostReplicas] = field(default_factory=dict)

    def states(self) -> dict[str, int]:
        """Replicas by state, as `sluice_replicas{api,state}` labels them."""
        return {"ready": self.ready, "starting": self.starting, "pending": self.pending}

    def to_dict(self) -> dict[str, Any]:
        """The `scaling` of `GET /apis/<name>` (`pending_reason` only while some are pending)."""
        body: dict[str, Any] = {
            "desired": self.desired, "ready": self.ready, "starting": self.starting, "pending": self.pending,
            "in_flight": self.in_flight,
            "hosts": {host: {"desired": h.desired, "ready": h.ready} for host, h in sorted(self.hosts.items())},
        }
        if self.pending:
            body["pending_reason"] = self.pending_reason
        return body


def realtime_counts(placed: PlacedReplicas | None, scale: ReplicaScale | None, live: Iterable[ReplicaRecord],
                    init_replicas: int) -> RealtimeCounts:
    """The counts of one API from its placement, its last scaling decision and its live replicas
    (`live`: the directory's live records of this API; draining ones are not counted ready)."""
    serving = [r for r in live if r.ready and not r.draining]
    ready_on: dict[str, int] = {}
    for record in serving:
        if record.placement_host:
            ready_on[record.placement_host] = ready_on.get(record.placement_host, 0) + 1
    assigned = placed.hosts if placed is not None else {}
    hosts = {host: HostReplicas(assigned.get(host, 0), ready_on.get(host, 0))
             for host in set(assigned) | set(ready_on)}
    decided = scale.desired if scale is not None else init_replicas
    desired = placed.desired if placed is not None else decided
    pending = placed.pending if placed is not None else 0
    starting = sum(max(0, h.desired - h.ready) for h in hosts.values())
    return RealtimeCounts(
        desired=desired, ready=len(serving), starting=starting, pending=pending,
        pending_reason=placed.reason if placed is not None and pending else "",
        in_flight=scale.in_flight if scale is not None else 0.0, hosts=hosts,
    )


def realtime_counts_of(apis: Iterable[DeployedApi], placements: dict[str, PlacedReplicas],
                       scales: dict[str, ReplicaScale], live: Iterable[ReplicaRecord]) -> dict[str, RealtimeCounts]:
    """Every RealtimeAPI of `apis` by name, from the records read once (all APIs' placements, scale
    decisions and live replicas)."""
    by_api: dict[str, list[ReplicaRecord]] = {}
    for record in live:
        by_api.setdefault(record.api, []).append(record)
    return {
        api.name: realtime_counts(placements.get(api.name), scales.get(api.name), by_api.get(api.name, []),
                                  autoscaling_of(api).init_replicas)
        for api in apis if api.kind == ApiKind.REALTIME
    }
