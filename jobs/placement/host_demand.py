"""How many hosts each host pool wants: the figure KEDA scales host pods on, as KubeRay's autoscaler
asks for Ray worker pods.

Scaling has two levels. Sluice places worker nodes and replicas on the hosts that offer room
(`node_plan.py`, `realtime.py`); something outside Sluice (KEDA on Kubernetes) decides how many
hosts of each pool (`foundation/host_pools.py`) exist. This module joins them: after placement,
beat counts, per pool, the live hosts that hold something (busy nodes, nodes starting for a
demand, replicas placed on them) and packs what placement could not place (worker nodes short of
room, pending replicas) into new hosts of the pool's size, first fit, largest first. A pool
wants its busy hosts plus those new ones: a pool with nothing to do wants 0, so its idle hosts
can go (and `sluice/pod_deletion_cost.py` makes the idle ones the ones removed).

What fits nowhere is counted by role and hardware whether pools are declared or not
(`sluice_unplaced` in `/metrics`); a unit too big for every pool of its kind is logged, since no
number of hosts would hold it.

`host_demand` is the pure part; `RedisHostDemandBook` keeps beat's last figures for `/metrics`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import Any

import redis

from foundation import keys
from foundation.host_pools import HostPool
from foundation.hosts import HostRecord, Resources

log = logging.getLogger(__name__)

WORKERS_ROLE = "workers"
REPLICAS_ROLE = "replicas"


@dataclass(frozen=True)
class Unplaced:
    """`count` units (worker nodes or replicas) that no live host could take, each of `need`, for
    hosts of `role` serving `hardware`."""

    role: str
    hardware: str
    count: int
    need: Resources


@dataclass(frozen=True)
class PoolFigures:
    """One pool's hosts: live ones holding something, live ones holding nothing, and how many it wants."""

    busy: int = 0
    idle: int = 0
    wanted: int = 0

    def to_dict(self) -> dict[str, int]:
        return {"busy": self.busy, "idle": self.idle, "wanted": self.wanted}


@dataclass(frozen=True)
class HostDemand:
    """Beat's figures: per pool, and the units unplaced per (role, hardware)."""

    pools: dict[str, PoolFigures] = field(default_factory=dict)
    unplaced: dict[tuple[str, str], int] = field(default_factory=dict)
    at: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"pools": {name: f.to_dict() for name, f in sorted(self.pools.items())},
                "unplaced": [{"role": r, "hardware": h, "count": n} for (r, h), n in sorted(self.unplaced.items())],
                "at": self.at}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> HostDemand:
        return cls({str(name): PoolFigures(int(f["busy"]), int(f["idle"]), int(f["wanted"]))
                    for name, f in d["pools"].items()},
                   {(str(u["role"]), str(u["hardware"])): int(u["count"]) for u in d["unplaced"]},
                   float(d["at"]))


def _hosts_to_hold(units: Sequence[Resources], size: Resources) -> int:
    """New hosts of `size` that hold `units`: first fit, largest first (each unit fits in `size`)."""
    free: list[Resources] = []
    for need in sorted(units, key=lambda r: (r.gpu, r.cpu_m, r.mem), reverse=True):
        for i, room in enumerate(free):
            if need.fits_in(room):
                free[i] = room - need
                break
        else:
            free.append(size - need)
    return len(free)


def _pool_for(pools: Sequence[HostPool], unit: Unplaced) -> HostPool | None:
    """The first pool (by name) of the unit's role and hardware whose host can hold one."""
    fitting = [p for p in pools if p.role == unit.role and p.hardware == unit.hardware and unit.need.fits_in(p.offers)]
    return min(fitting, key=lambda p: p.name, default=None)


def host_demand(pools: Sequence[HostPool], hosts: Sequence[HostRecord], holding: Set[str],
                unplaced: Sequence[Unplaced], now: float) -> HostDemand:
    """Each pool's busy, idle and wanted hosts, from the live `hosts`, the ids of those `holding`
    something, and what placement left `unplaced`."""
    units: dict[str, list[Resources]] = {pool.name: [] for pool in pools}
    unplaced_counts: dict[tuple[str, str], int] = {}
    for unit in unplaced:
        if unit.count <= 0:
            continue
        key = (unit.role, unit.hardware)
        unplaced_counts[key] = unplaced_counts.get(key, 0) + unit.count
        pool = _pool_for(pools, unit)
        if pool is None:
            if any(p.role == unit.role and p.hardware == unit.hardware for p in pools):
                log.warning("%d %s unit(s) of %s for %s hosts fit in no host pool's hosts", unit.count, unit.role,
                            unit.need, unit.hardware)
            continue
        units[pool.name].extend([unit.need] * unit.count)
    figures = {}
    for pool in pools:
        members = [h for h in hosts if h.pool == pool.name]
        busy = sum(1 for h in members if h.host_id in holding)
        wanted = busy + _hosts_to_hold(units[pool.name], pool.offers)
        figures[pool.name] = PoolFigures(busy, len(members) - busy, wanted)
    return HostDemand(figures, unplaced_counts, now)


class RedisHostDemandBook:
    """Beat's last `HostDemand`, in one Redis string (`keys.HOST_DEMAND`)."""

    def __init__(self, client: redis.Redis) -> None:
        self._redis = client

    def write(self, demand: HostDemand) -> None:
        self._redis.set(keys.HOST_DEMAND, json.dumps(demand.to_dict()))

    def read(self) -> HostDemand | None:
        """The last figures, None before beat's first (or when the record cannot be read: logged)."""
        raw = self._redis.get(keys.HOST_DEMAND)
        if raw is None:
            return None
        try:
            return HostDemand.from_dict(json.loads(raw))
        except (ValueError, TypeError, KeyError) as e:
            log.warning("ignoring the unreadable host demand record: %r", e)
            return None
