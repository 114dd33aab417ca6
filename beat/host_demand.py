"""Beat's step that measures how many hosts each host pool wants (`jobs/placement/host_demand.py`),
after worker nodes are planned and replicas placed, and leaves the figures for `/metrics`."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from foundation.host_pools import HostPool
from foundation.hosts import HOST_TTL_S, HostDirectory
from jobs.nodes.worker_hosts import WorkerHosts
from jobs.placement.host_demand import (
    REPLICAS_ROLE,
    WORKERS_ROLE,
    HostDemand,
    RedisHostDemandBook,
    Unplaced,
    host_demand,
)
from jobs.placement.realtime import RealtimePlacement

log = logging.getLogger(__name__)


class HostDemandWatch:
    """Measures the demand each step; logs a pool's wanted hosts when they change."""

    def __init__(self, pools: Sequence[HostPool], host_ttl_s: float = HOST_TTL_S) -> None:
        self._pools = tuple(pools)
        self._host_ttl_s = host_ttl_s
        self._wanted: dict[str, int] = {}

    def step(self, hosts: HostDirectory, worker_hosts: WorkerHosts, realtime: RealtimePlacement,
             book: RedisHostDemandBook, now: float) -> HostDemand:
        """Hosts holding something are those whose plan says so (worker hosts) or that run replicas;
        unplaced units are the worker nodes' shortfall and every RealtimeAPI's pending replicas."""
        holding = {host_id for host_id, plan in worker_hosts.plans().items() if plan.holds}
        placed = realtime.assignments.all()
        holding |= {host_id for p in placed.values() for host_id, n in p.hosts.items() if n > 0}
        unplaced = [Unplaced(WORKERS_ROLE, queue, short.count, short.need)
                    for queue, short in sorted(worker_hosts.shortfall().items())]
        for want in realtime.wants():
            record = placed.get(want.api)
            if record is not None and record.pending > 0:
                unplaced.append(Unplaced(REPLICAS_ROLE, want.hardware, record.pending, want.need))
        demand = host_demand(self._pools, hosts.live(now, self._host_ttl_s), holding, unplaced, now)
        book.write(demand)
        for name, figures in demand.pools.items():
            if self._wanted.get(name) != figures.wanted:
                log.info("host pool %s: %d host(s) wanted (%d busy, %d idle)", name, figures.wanted, figures.busy,
                         figures.idle, extra={"pool": name, "wanted": figures.wanted})
                self._wanted[name] = figures.wanted
        return demand
