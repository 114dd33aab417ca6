"""Which worker nodes serve each AsyncAPI, as job placement decides which serve each job.

An AsyncAPI's requests travel on a queue of their own (`async.<api>`, `async_queue`), and only
the nodes placed on it consume it (Celery's `add_consumer`, as for a job's queue). How many:
`autoscaling.min_replicas` (Cortex's default 1) nodes of its hardware queue; with
`min_replicas: 0`, none while nothing of it is queued or running, and one as soon as something is.
The autoscaler (issue 19) will set that number from the queue; placement is what makes it hold.

Nodes are chosen as for jobs: an API keeps its live nodes, and gets the least loaded others (jobs
and AsyncAPIs placed on each, counted together) up to its number. A node may serve jobs and
AsyncAPIs at once: it takes from its queues in turn (`jobs/celery_app.py`), so neither starves
the other. Beat runs `reconcile` every step, and re-sends the consumer commands (idempotent), so
a node lost or a command missed heals itself; the API places a new deployment at once (`place`)
so its first request does not wait for beat. A node (re)starting consumes what it is placed on
from the start (`jobs/worker_node.py`). A deleted API keeps its nodes until its queued requests
have run (each is failed: the API is gone), then its queue is dropped.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable
from typing import Protocol

import redis
from kombu.exceptions import KombuError

from foundation import keys
from foundation.api_registry import ApiRegistry, DeployedApi
from predictors_runtime.config import ApiConfig

from .async_request import ASYNC_KIND
from .async_store import AsyncRequestStore
from .nodes import NodeRegistry
from .queues import JobQueues

log = logging.getLogger(__name__)

ASYNC_QUEUE_PREFIX = "async."  # placed work, left out of a node's heartbeat as job queues are (`jobs/nodes.py`)


def async_queue(api_name: str) -> str:
    """The queue an AsyncAPI's tasks travel on (API names hold no '.', so it is no job's `job.<id>`)."""
    return f"{ASYNC_QUEUE_PREFIX}{api_name}"


class AsyncAssignments(Protocol):
    """Where placement keeps which nodes serve each AsyncAPI."""

    def all(self) -> dict[str, list[str]]:
        """API name -> the nodes placed on it."""

    def set(self, api_name: str, nodes: list[str]) -> None:
        """Place the API on these nodes."""

    def forget(self, api_name: str) -> None:
        """The API is gone and served by none."""


class RedisAsyncAssignments:
    """`AsyncAssignments` in one Redis hash (`keys.ASYNC_NODES`: API name -> JSON list of nodes)."""

    def __init__(self, client: redis.Redis) -> None:
        self._redis = client

    def all(self) -> dict[str, list[str]]:
        raw = self._redis.hgetall(keys.ASYNC_NODES)
        return {(k.decode() if isinstance(k, bytes) else k): list(json.loads(v)) for k, v in raw.items()}

    def set(self, api_name: str, nodes: list[str]) -> None:
        self._redis.hset(keys.ASYNC_NODES, api_name, json.dumps(nodes))

    def forget(self, api_name: str) -> None:
        self._redis.hdel(keys.ASYNC_NODES, api_name)


def wanted_nodes(deployed: DeployedApi, open_requests: int) -> int:
    """How many nodes serve the API: `min_replicas`, and at least one while it has requests open."""
    scaling = ApiConfig.from_dict(deployed.spec).autoscaling
    minimum = scaling.min_replicas if scaling is not None else 1
    return max(minimum, 1 if open_requests else 0)


class AsyncPlacement:
    """Places AsyncAPIs on worker nodes and takes them back (beat's step, and the API at deploy)."""

    def __init__(self, registry: ApiRegistry, requests: AsyncRequestStore, assignments: AsyncAssignments,
                 queues: JobQueues, nodes: NodeRegistry, job_load: Callable[[], Counter[str]]) -> None:
        """`job_load()`: how many active jobs each node serves (`jobs.placement.Placement.load`)."""
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

    def reconcile(self, now: float) -> None:
        """One step: every AsyncAPI on its number of live nodes, deleted ones retired once drained."""
        live = self._nodes.live(now)
        assigned = self.assignments.all()
        load = self._load(assigned)
        apis = {api.name: api for api in self._registry.all() if api.kind == ASYNC_KIND}
        for name in sorted(apis):
            self._place(apis[name], assigned.get(name, []), live, load, now)
        for name in sorted(set(assigned) - set(apis)):
            self._retire(name, assigned[name], live, now)

    def place(self, deployed: DeployedApi, now: float) -> list[str]:
        """Place one (new or redeployed) AsyncAPI now; returns its nodes."""
        assigned = self.assignments.all()
        return self._place(deployed, assigned.get(deployed.name, []), self._nodes.live(now),
                           self._load(assigned), now)

    def _place(self, api: DeployedApi, current: list[str], live: dict[str, list[str]], load: Counter[str],
               now: float) -> list[str]:
        want = wanted_nodes(api, self._open(api.name, now))
        kept = [n for n in current if api.queue in live.get(n, ())][:want]
        others = sorted((n for n, queues in live.items() if api.queue in queues and n not in kept),
                        key=lambda n: (load[n] - (n in current), n))
        nodes = kept + others[: max(want - len(kept), 0)]
        if nodes != current:
            log.info("async api %s moves from nodes %s to %s (%d wanted)", api.name, current, nodes, want)
            load.subtract(current)
            load.update(nodes)
            self.assignments.set(api.name, nodes)
            left = [n for n in current if n not in nodes and n in live]
            self._broadcast(self._queues.cancel_consumers, api.name, left)
        elif want and not nodes:
            log.warning("no live worker serves queue %s yet; async api %s waits for one", api.queue, api.name)
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
