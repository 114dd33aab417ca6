"""Which worker nodes serve each AsyncAPI, as job placement decides which serve each job.

An AsyncAPI's requests travel on a queue of their own (`async.<api>`, `async_queue`), and only
the nodes placed on it consume it (Celery's `add_consumer`, as for a job's queue). How many: a new
API gets `autoscaling.init_replicas` (default `min_replicas`, default 1) nodes of its hardware
queue; then beat's scaler (`jobs/scaling/asyncapi.py`) moves the number between `min_replicas` and
`max_replicas` from its queue, to zero with `min_replicas: 0`; placement is what makes it hold.

Nodes are chosen as for jobs: an API keeps its live nodes, and gets the least loaded others (jobs
and AsyncAPIs placed on each, counted together) up to its number. A node may serve jobs and
AsyncAPIs at once: it takes from its queues in turn (`jobs/celery_app.py`), so neither starves
the other. Beat runs `reconcile` every step, and re-sends the consumer commands (idempotent), so
a node lost or a command missed heals itself; the API places a new deployment at once (`place`)
so its first request does not wait for beat. A node (re)starting consumes what it is placed on
from the start (`jobs/nodes/worker_node.py`). A deleted API keeps its nodes until its queued requests
have run (each is failed: the API is gone), then its queue is dropped.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import redis
from kombu.exceptions import KombuError

from foundation import keys
from foundation.api_kinds import ApiKind
from foundation.api_registry import ApiRegistry, DeployedApi
from foundation.json_hash import JsonHash
from jobs.asyncapi.store import AsyncRequestStore
from jobs.nodes.registry import NodeRegistry
from jobs.scaling.config import autoscaling_of
from jobs.transport.queues import JobQueues

log = logging.getLogger(__name__)

# Placed work, left out of a node's heartbeat as job queues are (`jobs/nodes/registry.py`).
ASYNC_QUEUE_PREFIX = "async."


def async_queue(api_name: str) -> str:
    """The queue an AsyncAPI's tasks travel on (API names hold no '.', so it is no job's `job.<id>`)."""
    return f"{ASYNC_QUEUE_PREFIX}{api_name}"


@dataclass(frozen=True)
class Placed:
    """An AsyncAPI's nodes, and the count wanted with the in-flight figure it was wanted for."""

    nodes: list[str]
    desired: int
    in_flight: float

    def to_dict(self) -> dict[str, Any]:
        return {"nodes": self.nodes, "desired": self.desired, "in_flight": self.in_flight}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Placed:
        return cls(list(d["nodes"]), int(d["desired"]), float(d["in_flight"]))


class AsyncAssignments(Protocol):
    """Where placement keeps which nodes serve each AsyncAPI."""

    def all(self) -> dict[str, list[str]]:
        """API name -> the nodes placed on it."""

    def placed(self) -> dict[str, Placed]:
        """API name -> its nodes with the count wanted (what `sluice get` and `/metrics` show)."""

    def set(self, api_name: str, nodes: list[str], desired: int | None = None, in_flight: float = 0.0) -> None:
        """Place the API on these nodes (`desired`: the count wanted, default as many)."""

    def forget(self, api_name: str) -> None:
        """The API is gone and served by none."""


class RedisAsyncAssignments:
    """`AsyncAssignments` in one Redis hash (`keys.ASYNC_NODES`: API name -> JSON list of nodes)."""

    def __init__(self, client: redis.Redis) -> None:
        self._records = JsonHash(client, keys.ASYNC_NODES, Placed.to_dict, Placed.from_dict)

    def all(self) -> dict[str, list[str]]:
        return {api: placed.nodes for api, placed in self.placed().items()}

    def placed(self) -> dict[str, Placed]:
        return self._records.all()

    def set(self, api_name: str, nodes: list[str], desired: int | None = None, in_flight: float = 0.0) -> None:
        self._records.set(api_name, Placed(list(nodes), len(nodes) if desired is None else desired, in_flight))

    def forget(self, api_name: str) -> None:
        self._records.forget(api_name)


def initial_nodes(deployed: DeployedApi, open_requests: int) -> int:
    """How many nodes serve a new API before its scaler's first decision: `init_replicas`, and at
    least one while it has requests open."""
    return max(autoscaling_of(deployed).init_replicas, 1 if open_requests else 0)


def _kept_count(api: DeployedApi, current: Placed | None, open_requests: int) -> int:
    """Without a scaler's word: a new API's `initial_nodes`, else the count last wanted for it."""
    if current is None:
        return initial_nodes(api, open_requests)
    return max(current.desired, 1 if open_requests else 0)


# What decides an API's node count in beat: (api, its in-flight requests, its nodes placed, now) -> count.
Wanted = Callable[[DeployedApi, int, int, float], int]


class AsyncPlacement:
    """Places AsyncAPIs on worker nodes and takes them back (beat's step, and the API at deploy)."""

    def __init__(self, registry: ApiRegistry, requests: AsyncRequestStore, assignments: AsyncAssignments,
                 queues: JobQueues, nodes: NodeRegistry, job_load: Callable[[], Counter[str]]) -> None:
        """`job_load()`: how many active jobs each node serves (`jobs.placement.batch.Placement.load`)."""
        self._registry = registry
        self._requests = requests
        self.assignments = assignments
        self._queues = queues
        self._nodes = nodes
        self._job_load = job_load

    def _open(self, api_name: str, now: float) -> int:
        counts = self._requests.counts(api_name, now)
        return counts.in_queue + counts.in_progress

    def _load(self, assigned: dict[str, list[str]]) -> Counter[str]:
        load = self._job_load()
        load.update(node for nodes in assigned.values() for node in nodes)
        return load

    def reconcile(self, now: float, wanted: Wanted | None = None) -> None:
        """One step: every AsyncAPI on the number of live nodes `wanted` gives (beat's scaler; without
        one, as many as it has, or `initial_nodes` for a new one), deleted ones retired once drained."""
        live = self._nodes.live(now)
        placed = self.assignments.placed()
        assigned = {api: p.nodes for api, p in placed.items()}
        load = self._load(assigned)
        apis = {api.name: api for api in self._registry.all() if api.kind == ApiKind.ASYNC}
        for name in sorted(apis):
            api, current = apis[name], placed.get(name)
            open_now = self._open(name, now)
            if wanted is not None:
                want = wanted(api, open_now, len([n for n in current.nodes if n in live]) if current else 0, now)
            else:
                want = _kept_count(api, current, open_now)
            self._place(api, current.nodes if current else [], live, load, want, open_now)
        for name in sorted(set(assigned) - set(apis)):
            self._retire(name, assigned[name], live, now)

    def place(self, deployed: DeployedApi, now: float) -> list[str]:
        """Place a deployed AsyncAPI now: a new one on `initial_nodes`, a redeployed one where it is
        (beat's scaler moves it from there); returns its nodes."""
        placed = self.assignments.placed()
        current = placed.get(deployed.name)
        open_now = self._open(deployed.name, now)
        load = self._load({api: p.nodes for api, p in placed.items()})
        return self._place(deployed, current.nodes if current else [], self._nodes.live(now), load,
                           _kept_count(deployed, current, open_now), open_now)

    def _place(self, api: DeployedApi, current: list[str], live: dict[str, list[str]], load: Counter[str],
               want: int, in_flight: int) -> list[str]:
        kept = [n for n in current if api.queue in live.get(n, ())][:want]
        others = sorted((n for n, queues in live.items() if api.queue in queues and n not in kept),
                        key=lambda n: (load[n] - (n in current), n))
        nodes = kept + others[: max(want - len(kept), 0)]
        if nodes != current:
            log.info("async api %s moves from nodes %s to %s (%d wanted)", api.name, current, nodes, want)
            load.subtract(current)
            load.update(nodes)
            left = [n for n in current if n not in nodes and n in live]
            self._broadcast(self._queues.cancel_consumers, api.name, left)
        elif want > len(nodes):
            log.warning("async api %s wants %d node(s) of queue %s; %d live ones serve it", api.name, want,
                        api.queue, len(nodes))
        self.assignments.set(api.name, nodes, want, float(in_flight))
        self._broadcast(self._queues.add_consumers, api.name, nodes)
        return nodes

    def _retire(self, api_name: str, nodes: list[str], live: dict[str, list[str]], now: float) -> None:
        """A deleted API: its nodes run (and fail) what is still queued, then its queue goes."""
        if self._open(api_name, now) and any(n in live for n in nodes):
            self._broadcast(self._queues.add_consumers, api_name, [n for n in nodes if n in live])
            return
        log.info("async api %s is gone and drained: its nodes %s stop serving it", api_name, nodes)
        self._broadcast(self._queues.cancel_consumers, api_name, [n for n in nodes if n in live])
        self._queues.drop(async_queue(api_name))
        self.assignments.forget(api_name)

    def assigned_queues(self, node: str) -> list[str]:
        """The queues of the AsyncAPIs placed on `node`, which it consumes as soon as it (re)starts."""
        return sorted(async_queue(api) for api, nodes in self.assignments.all().items() if node in nodes)

    def _broadcast(self, send: Callable[[str, list[str]], None], api_name: str, nodes: list[str]) -> None:
        if not nodes:
            return
        try:
            send(async_queue(api_name), nodes)
        except (KombuError, redis.RedisError, OSError):  # a broker hiccup: the next step sends it again
            log.exception("control command for async api %s failed", api_name)
