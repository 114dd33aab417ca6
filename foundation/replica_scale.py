"""How many replicas each RealtimeAPI should have: the meeting point of its scaler and placement.

The scaler (beat, from the in-flight requests the proxies sample) writes a `ReplicaScale` per API
whenever it decides; placement reads it to know how many replicas to place, and `GET /apis/<name>`,
`sluice get` and `/metrics` show it. An API with no record yet (just deployed, or no scaler
running) is placed at its `init_replicas`: the scaler's absence never removes a replica.

`ScaleBook` is what callers type against; `RedisScaleBook` keeps the records in one Redis hash
(`keys.REPLICA_SCALE`), `foundation.memory.MemoryScaleBook` in a dict for fast tests.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Protocol

import redis

from foundation import keys

from .json_hash import JsonHash


@dataclass(frozen=True)
class ReplicaScale:
    """One API's replica count as last decided, with the figure it was decided on."""

    desired: int         # replicas wanted, within [min_replicas, max_replicas]
    in_flight: float     # the window-averaged in-flight requests the scaler saw
    decided_at: float    # when (epoch seconds)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ReplicaScale:
        return cls(int(d["desired"]), float(d["in_flight"]), float(d["decided_at"]))


class ScaleBook(Protocol):
    """Where each RealtimeAPI's decided replica count is kept."""

    def get(self, api_name: str) -> ReplicaScale | None:
        """The API's last decision, or None when none was made yet."""

    def all(self) -> dict[str, ReplicaScale]:
        """API name -> its last decision."""

    def set(self, api_name: str, scale: ReplicaScale) -> None:
        """Record a decision."""

    def forget(self, api_name: str) -> None:
        """The API was deleted."""


class RedisScaleBook(JsonHash[ReplicaScale]):
    """`ScaleBook` in one Redis hash (`keys.REPLICA_SCALE`: API name -> JSON)."""

    def __init__(self, client: redis.Redis) -> None:
        super().__init__(client, keys.REPLICA_SCALE, ReplicaScale.to_dict, ReplicaScale.from_dict)
