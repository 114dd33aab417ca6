"""Where each RealtimeAPI's replicas are placed: what placement writes and each host's agent runs.

Placement (beat, and the API at deploy: `jobs/placement/realtime.py`) decides how many replicas of
each API every live host runs, and why any it wanted fit nowhere; each host's replica manager
(`sluice/replica_manager.py`) reads its own counts and runs that many launchers. `GET /apis/<name>`,
`sluice get` and `/metrics` show the same record.

`ReplicaAssignments` is what callers type against; `RedisReplicaAssignments` keeps the records in
one Redis hash (`keys.REPLICA_PLACEMENT`), `foundation.memory.MemoryReplicaAssignments` in a dict
for fast tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import redis

from foundation import keys

from .json_hash import JsonHash


@dataclass(frozen=True)
class PlacedReplicas:
    """One API's placement: replicas per host, the count wanted, and what did not fit."""

    hosts: dict[str, int] = field(default_factory=dict)  # host id -> replicas it runs (none listed at 0)
    desired: int = 0
    pending: int = 0       # wanted but placed nowhere
    reason: str = ""       # why they are pending ("no host has 1 gpu free"); "" when none is

    @property
    def placed(self) -> int:
        return sum(self.hosts.values())

    def to_dict(self) -> dict[str, Any]:
        return {"hosts": dict(sorted(self.hosts.items())), "desired": self.desired, "pending": self.pending,
                "reason": self.reason}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PlacedReplicas:
        return cls({str(h): int(n) for h, n in d.get("hosts", {}).items()}, int(d.get("desired", 0)),
                   int(d.get("pending", 0)), str(d.get("reason", "")))


class ReplicaAssignments(Protocol):
    """Where the placement of every RealtimeAPI's replicas is kept."""

    def all(self) -> dict[str, PlacedReplicas]:
        """API name -> its placement."""

    def set(self, api_name: str, placed: PlacedReplicas) -> None:
        """Record an API's placement (replacing the last one)."""

    def forget(self, api_name: str) -> None:
        """The API was deleted: no host runs it."""


def on_host(placements: dict[str, PlacedReplicas], host_id: str) -> dict[str, int]:
    """API name -> how many of its replicas `host_id` runs (APIs it runs none of are left out)."""
    return {api: p.hosts[host_id] for api, p in placements.items() if p.hosts.get(host_id, 0) > 0}


class RedisReplicaAssignments(JsonHash[PlacedReplicas]):
    """`ReplicaAssignments` in one Redis hash (`keys.REPLICA_PLACEMENT`: API name -> JSON)."""

    def __init__(self, client: redis.Redis) -> None:
        super().__init__(client, keys.REPLICA_PLACEMENT, PlacedReplicas.to_dict, PlacedReplicas.from_dict)
